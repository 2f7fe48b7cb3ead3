package volmount

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// TestAKilledOrExitingHelperDoesNotStay: a helper just killed (kill -9)
// lives on for a moment, longer on a loaded machine; its mount is no
// longer served and may be made again (Stays false), though the process
// is still there (Alive). The kernel's words for it: a SIGKILL pending
// for the process or the thread, or PF_EXITING in the flags; a live
// process's own words say it stays.
func TestAKilledOrExitingHelperDoesNotStay(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p, err := processOf(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Alive() || !p.Stays() {
		t.Fatalf("a sleeping child: alive %v, stays %v; want both", p.Alive(), p.Stays())
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
	if err != nil {
		t.Fatal(err)
	}
	if ending(stat, status) {
		t.Fatalf("a sleeping child reads as ending: %s\n%s", stat, status)
	}

	// Its words as the kernel would give them while it is killed or exits.
	fields := strings.Fields(string(stat))
	i := 0
	for !strings.HasSuffix(fields[i], ")") {
		i++
	}
	withField := func(n int, value string) []byte {
		f := append([]string(nil), fields...)
		f[i+n-2] = value // fields[i+1] is field 3, the state
		return []byte(strings.Join(f, " "))
	}
	withFlags := func(flags string) []byte { return withField(9, flags) }
	withMask := func(name, mask string) []byte {
		var out []string
		for _, line := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(line, name+":") {
				line = name + ":\t" + mask
			}
			out = append(out, line)
		}
		return []byte(strings.Join(out, "\n"))
	}
	for _, c := range []struct {
		what         string
		stat, status []byte
		want         bool
	}{
		{"exiting (PF_EXITING)", withFlags("4194372"), status, true},
		{"other flags", withFlags("4194368"), status, false},
		{"a SIGKILL pending for the process", stat, withMask("ShdPnd", "0000000000000100"), true},
		{"a SIGKILL pending for the thread", stat, withMask("SigPnd", "0000000000000100"), true},
		{"a SIGTERM and a SIGHUP pending", stat, withMask("ShdPnd", "0000000000004001"), false},
		{"dead (X)", withField(3, "X"), status, true},
	} {
		if got := ending(c.stat, c.status); got != c.want {
			t.Errorf("%s: ending %v, want %v", c.what, got, c.want)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if p.Alive() || p.Stays() {
		t.Fatalf("a child killed and reaped: alive %v, stays %v; want neither", p.Alive(), p.Stays())
	}
}
