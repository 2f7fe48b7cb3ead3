package main

import (
	"testing"
	"time"
)

// TestE2EAHungSecondaryCostsWritesAtMostAboutThreeSeconds: beta's replnode
// is SIGSTOPped (its TCP connections stay up; it answers nothing). A
// client writing to alpha at queue depth 1 sees one write wait for at
// most the peer timeout (2 s) plus a heartbeat, not the 12 s a dead TCP
// connection would take to notice; afterwards writes run at local speed.
// When beta wakes up it catches up by bitmap.
func TestE2EAHungSecondaryCostsWritesAtMostAboutThreeSeconds(t *testing.T) {
	e2e(t)
	c := newProcCluster(t, 64<<20, 61)
	c.start("alpha")
	c.start("beta")
	c.waitInSync("alpha")
	client, err := dialRawNBD(c.uri("alpha"))
	if err != nil {
		t.Fatal(err)
	}
	defer client.close()
	block := make([]byte, 4096)
	write := func(i int) time.Duration {
		t.Helper()
		for j := range block {
			block[j] = byte(i + j)
		}
		began := time.Now()
		if errno, err := client.write(uint64(i%4096)*4096, block); err != nil || errno != 0 {
			t.Fatalf("write %d: errno %d, %v", i, errno, err)
		}
		return time.Since(began)
	}
	for i := range 50 {
		write(i)
	}
	c.pause("beta")
	paused := time.Now()
	var worst time.Duration
	n := 0
	for time.Since(paused) < 5*time.Second {
		worst = max(worst, write(1000+n))
		n++
	}
	t.Logf("beta stopped: %d writes in 5 s, the slowest took %s", n, worst.Round(time.Millisecond))
	if worst > 3500*time.Millisecond {
		t.Fatalf("a hung secondary held a write for %s, want at most about 3 s (peer_timeout 2s + a heartbeat)", worst)
	}
	if n < 100 {
		t.Fatalf("only %d writes in the 5 s after beta hung: alpha did not go on at local speed", n)
	}
	c.resume("beta")
	v := c.waitInSync("alpha")
	if r := v.replica("beta"); r.Decision != "source-use-bitmap" {
		t.Fatalf("beta caught up by %q (%s), want source-use-bitmap", r.Decision, r.SyncRule)
	}
}
