//go:build deadlock

package lockorder

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestAnInversionFailsTheProcess pins what the deadlock build is for: two
// mutexes taken in one order by one goroutine and in the other by the
// next fail the process, with go-deadlock's report of both orders, while
// a mutex merely held for long does not (DeadlockTimeout is off). The
// inversion runs in a child process, as it ends it.
func TestAnInversionFailsTheProcess(t *testing.T) {
	if os.Getenv("LOCKORDER_INVERT") == "1" {
		var a, b Mutex
		held := 0
		lockBoth := func(first, second *Mutex) {
			first.Lock()
			second.Lock()
			held++
			second.Unlock()
			first.Unlock()
		}
		done := make(chan struct{})
		go func() { lockBoth(&a, &b); close(done) }()
		<-done
		lockBoth(&b, &a)
		os.Exit(held - 2) // 0; not reached when the inversion is caught
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAnInversionFailsTheProcess$")
	cmd.Env = append(os.Environ(), "LOCKORDER_INVERT=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("taking two mutexes in both orders did not fail the process:\n%s", out)
	}
	if !strings.Contains(string(out), "POTENTIAL DEADLOCK") || !strings.Contains(string(out), "Inconsistent locking") {
		t.Fatalf("the process failed (%v) without go-deadlock's report of an inversion:\n%s", err, out)
	}
}

// TestOrderedLocksPass is the other side: the same two mutexes always
// taken in one order, by several goroutines, fail nothing.
func TestOrderedLocksPass(t *testing.T) {
	var a, b Mutex
	n := 0
	done := make(chan struct{})
	for range 4 {
		go func() {
			for range 100 {
				a.Lock()
				b.Lock()
				n++
				b.Unlock()
				a.Unlock()
			}
			done <- struct{}{}
		}()
	}
	for range 4 {
		<-done
	}
	if n != 400 {
		t.Fatalf("%d of 400 turns counted", n)
	}
}

// TestOwnerCheckFailsOffItsGoroutine: in this build an owned change made
// by another goroutine panics, and passes on the owner, before any Claim
// and after Release.
func TestOwnerCheckFailsOffItsGoroutine(t *testing.T) {
	var o Owner
	o.Check("before any claim", "the test's state") // nobody owns it yet
	claimed, done, released := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		o.Claim()
		o.Check("the owner's own change", "the test's state")
		close(claimed)
		<-done
		o.Release()
		close(released)
	}()
	<-claimed
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "only its owner") {
				t.Errorf("a change off the owner's goroutine: recovered %v, want a panic naming the owner", r)
			}
		}()
		o.Check("a change off the owner", "the test's state")
	}()
	close(done)
	<-released
	o.Check("after the owner released it", "the test's state")
}
