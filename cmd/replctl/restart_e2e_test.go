package main

// End-to-end tests of a primary that restarts: it must not serve alone
// while a newer primary may exist, and restarts after a failover resync
// nothing once the replicas are in sync. Each node is its own replnode
// process (procCluster in crash_e2e_test.go), so it can be killed with
// SIGKILL, hung with SIGSTOP and restarted.

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// forceCommand is what a restarted primary that waits for its peer must
// tell the operator to run to serve alone.
const forceCommand = "replctl primary vol0 --node alpha --force --yes"

// splitBrainReason returns the first replica reason that reports a split
// brain, or "".
func splitBrainReason(v *volumeStatus) string {
	for _, r := range v.Replicas {
		if strings.Contains(r.Reason, "split-brain") {
			return r.Node + ": " + r.Reason
		}
	}
	return ""
}

// attemptWrite opens a fresh NBD connection to uri and writes data at off.
// It says whether the server acknowledged the write, and if not, why.
func attemptWrite(uri string, off uint64, data []byte) (acked bool, why string) {
	c, err := dialRawNBDWithin(uri, 2*time.Second)
	if err != nil {
		return false, "connect: " + err.Error()
	}
	defer c.close()
	errno, err := c.write(off, data)
	switch {
	case err != nil:
		return false, "write: " + err.Error()
	case errno != 0:
		return false, fmt.Sprintf("write: errno %d", errno)
	}
	return true, ""
}

// assertRefusesWrites tries to write to node name's export, on fresh raw
// connections and with qemu-io, for at least d, and reports every write the
// node acknowledged.
func assertRefusesWrites(t *testing.T, c *procCluster, name string, d time.Duration) {
	t.Helper()
	uri := c.uri(name)
	data := bytes.Repeat([]byte{0xee}, 4096)
	attempts, acked := 0, 0
	whys := map[string]int{}
	end := time.Now().Add(d)
	for i := uint64(0); time.Now().Before(end); i++ {
		attempts++
		ok, why := attemptWrite(uri, 8<<20+(i%256)*4096, data)
		if ok {
			acked++
		} else {
			whys[why]++
		}
		time.Sleep(100 * time.Millisecond) // pace the attempts over the window
	}
	r, ok := tryQemuIOWithin(t, 20*time.Second, uri, "write -P 0xee 12M 64k", "flush")
	attempts++
	if ok {
		acked++
	}
	t.Logf("%s's export over %s: %d write attempts, %d acknowledged; refusals: %v; qemu-io: %s", name, d, attempts, acked, whys, r)
	if acked != 0 {
		t.Errorf("%s acknowledged %d of %d writes while it could not know whether a newer primary exists; want 0 (it must serve nothing until a peer answers or the operator runs %q)",
			name, acked, attempts, forceCommand)
	}
}

// assertWaitingReason checks that node name reports itself Primary and
// waiting for a peer, with the command that makes it serve alone.
func assertWaitingReason(t *testing.T, c *procCluster, name string) {
	t.Helper()
	v := c.mustStatus(name)
	r := v.replica(name)
	if r == nil {
		t.Fatalf("status on %s has no replica %s: %+v", name, name, v.Replicas)
	}
	t.Logf("%s's status of itself: role %s, disk %s, replication %s, reason %q", name, r.Role, r.Disk, r.Replication, r.Reason)
	if r.Role != "Primary" {
		t.Errorf("%s's replica has role %q, want Primary (waiting for a peer)", name, r.Role)
	}
	if !strings.Contains(r.Reason, "waiting") || !strings.Contains(r.Reason, forceCommand) {
		t.Errorf("%s's replica reason is %q; want it to say it is waiting for a peer and to name %q", name, r.Reason, forceCommand)
	}
}

// TestE2ERestartedPrimaryServesNothingUntilAPeerAnswers: two writers after
// a restart. alpha (primary) is killed with SIGKILL, beta is forced to
// primary and takes writes, then hangs (SIGSTOP) as alpha restarts. alpha
// cannot tell whether a newer primary exists, so it must acknowledge no
// write and say it waits (and how to force it); when beta answers again,
// alpha follows it: no split brain, beta's writes intact.
func TestE2ERestartedPrimaryServesNothingUntilAPeerAnswers(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	const size = 64 << 20
	c := newProcCluster(t, size, 61)
	c.start("alpha")
	c.start("beta")
	c.waitInSync("alpha")
	qemuIO(t, c.uri("alpha"), "write -P 0x11 0 4M", "flush")
	c.waitInSync("alpha")

	c.kill("alpha")
	if r := c.ctl("beta", "primary", volName, "--node", "beta", "--force", "--yes"); !r.ok() {
		t.Fatalf("replctl primary vol0 --node beta --force --yes: %s", r)
	}
	c.waitFor("beta", "beta Primary after --force", 30*time.Second, func(v *volumeStatus) bool {
		r := v.replica("beta")
		return v.Primary == "beta" && r != nil && r.Role == "Primary" && v.NBDURI != ""
	})
	betaWrites := []string{"write -P 0xb2 1M 2M", "write -P 0xb3 40M 64k", "flush"}
	qemuIO(t, c.uri("beta"), betaWrites...)

	c.pause("beta")
	c.start("alpha")
	c.waitListening("alpha", 30*time.Second)
	assertRefusesWrites(t, c, "alpha", 5*time.Second)
	assertWaitingReason(t, c, "alpha")

	c.resume("beta")
	v := c.waitFor("beta", "alpha Secondary following beta, all in sync (or a split brain)", 30*time.Second, func(v *volumeStatus) bool {
		a := v.replica("alpha")
		return splitBrainReason(v) != "" || (v.Primary == "beta" && a != nil && a.Role == "Secondary" && v.inSync())
	})
	if sb := splitBrainReason(v); sb != "" {
		t.Fatalf("after beta answered again a split brain is reported (%s): alpha took writes of its own while beta was primary", sb)
	}
	if v := c.mustStatus("alpha"); v.Primary != "beta" || splitBrainReason(v) != "" {
		t.Fatalf("alpha's status: primary %q, split brain %q; want beta and none", v.Primary, splitBrainReason(v))
	}
	qemuIO(t, c.uri("beta"), "read -P 0x11 0 1M", "read -P 0xb2 1M 2M", "read -P 0x11 3M 1M", "read -P 0xb3 40M 64k", "read -P 0 8M 1M", "read -P 0 12M 64k")
	compareFiles(t, c.disk("alpha"), c.disk("beta"), size)
}

// TestE2EPrimaryRestartedAloneWaitsUntilForced: both nodes stop cleanly and
// only the primary comes back. It cannot know whether its peer was
// promoted meanwhile, so its export refuses IO and status says it waits and
// how to force it. `replctl primary --force --yes` makes it serve; when the
// peer comes back it catches up with the write.
func TestE2EPrimaryRestartedAloneWaitsUntilForced(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	const size = 64 << 20
	c := newStoppedPair(t, size, "write -P 0x21 0 1M")

	c.start("alpha")
	c.waitListening("alpha", 30*time.Second)
	if r, ok := tryQemuIOWithin(t, 20*time.Second, c.uri("alpha"), "write -P 0xee 8M 64k", "flush"); ok {
		t.Errorf("alpha, restarted alone, accepted a write before any peer answered or the operator forced it: %s", r)
	} else {
		t.Logf("alpha, restarted alone, refused IO: %s", r)
	}
	assertWaitingReason(t, c, "alpha")

	if r := c.ctl("alpha", "primary", volName, "--node", "alpha", "--force", "--yes"); !r.ok() {
		t.Fatalf("%s: %s", forceCommand, r)
	}
	// Forced, alpha serves (the export opens after the promotion).
	qemuIOEventually(t, 10*time.Second, "after "+forceCommand, c.uri("alpha"), "write -P 0x5c 2M 1M", "flush", "read -P 0x5c 2M 1M", "read -P 0x21 0 1M")

	c.start("beta")
	v := c.waitFor("alpha", "beta UpToDate and Connected", 30*time.Second, (*volumeStatus).inSync)
	if v.Primary != "alpha" {
		t.Fatalf("after beta came back the primary is %q, want alpha", v.Primary)
	}
	compareFiles(t, c.disk("alpha"), c.disk("beta"), size)
}

// TestE2ECleanlyRestartedPrimaryServesOnceItsPeerIsUp: both nodes stop
// cleanly, alpha (primary) starts first, then beta: alpha serves without
// any --force as soon as beta answers.
func TestE2ECleanlyRestartedPrimaryServesOnceItsPeerIsUp(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	const size = 64 << 20
	c := newStoppedPair(t, size, "write -P 0x31 0 1M")

	c.start("alpha")
	c.waitListening("alpha", 30*time.Second)
	c.start("beta")
	// alpha opens IO when beta answers.
	took := qemuIOEventually(t, 30*time.Second, "after beta started", c.uri("alpha"), "write -P 0x32 1M 1M", "flush", "read -P 0x32 1M 1M", "read -P 0x31 0 1M")
	t.Logf("alpha served a write %s after beta started", took.Round(time.Millisecond))
	c.waitInSync("alpha")
	compareFiles(t, c.disk("alpha"), c.disk("beta"), size)
}

// TestE2ECleanRestartsAfterAFailoverResyncNothing: a finished resync
// clears the bitmap. alpha is killed with SIGKILL in the middle of random
// writes, beta is forced to primary and writes a little, alpha comes back
// and catches up. From then on a clean restart of alpha, with no write in
// between, must resync nothing: rule no-sync, resynced_bytes 0.
func TestE2ECleanRestartsAfterAFailoverResyncNothing(t *testing.T) {
	e2eBeside(t)
	fio := RequireTool(t, "fio", "fio")
	RequireTool(t, "qemu-io", "qemu-utils")
	const size = 256 << 20
	c := newProcCluster(t, size, 61)
	c.start("alpha")
	c.start("beta")
	c.waitInSync("alpha")

	// fio writes until the kill: its runtime and the wait for 64 MiB below
	// are bounds for a starved machine (this test runs beside others),
	// not a rate; an idle one writes 64 MiB in seconds.
	fioCmd := exec.Command(fio, "--name=w", "--ioengine=nbd", "--uri="+c.uri("alpha"), "--rw=randwrite", "--bs=4k",
		"--size=256M", "--iodepth=16", "--runtime=300", "--time_based", "--randrepeat=0", "--output=/dev/null")
	fioCmd.Dir = t.TempDir()
	if err := fioCmd.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fioCmd.Wait() }()
	t.Cleanup(func() {
		_ = fioCmd.Process.Kill()
		<-fioDone
	})
	// Kill alpha once it has written 64 MiB, in the middle of the writes.
	var n uint64
	var err error
	if !within(3*time.Minute, 20*time.Millisecond, func() bool {
		n, err = c.writeBytes("alpha")
		if err == nil && n >= 64<<20 {
			t.Logf("alpha wrote %d bytes; kill -9", n)
			return true
		}
		select {
		case err := <-fioDone:
			fioDone <- err
			t.Fatalf("fio ended (%v) before alpha wrote 64 MiB (%d bytes)", err, n)
		default:
		}
		return false
	}) {
		t.Fatalf("alpha wrote %d bytes (%v) in 3 minutes of fio, want 64 MiB", n, err)
	}
	c.kill("alpha")

	if r := c.ctl("beta", "primary", volName, "--node", "beta", "--force", "--yes"); !r.ok() {
		t.Fatalf("replctl primary vol0 --node beta --force --yes: %s", r)
	}
	c.waitFor("beta", "beta Primary after --force", 30*time.Second, func(v *volumeStatus) bool {
		r := v.replica("beta")
		return v.Primary == "beta" && r != nil && r.Role == "Primary" && v.NBDURI != ""
	})
	qemuIO(t, c.uri("beta"), "write -P 0xc1 100M 1M", "write -P 0xc2 200M 64k", "flush")

	// restartAlpha starts alpha and waits until it is Secondary, connected
	// and in sync. alpha's replication and disk come from its own (new)
	// process, which is Connected and UpToDate only once beta has decided
	// the connection: the decision in status is this connection's. beta's
	// "connected" event is logged for the record.
	restartAlpha := func(what string) (*volumeStatus, string) {
		t.Helper()
		since := time.Now()
		c.start("alpha")
		v := c.waitFor("beta", what+": alpha Secondary, connected and in sync", 90*time.Second, func(v *volumeStatus) bool {
			a := v.replica("alpha")
			return a != nil && a.Reachable && a.Role == "Secondary" && v.Primary == "beta" && v.inSync()
		})
		var conn string
		if evs, err := c.eventsSince("beta", "connected", since); err == nil {
			for _, e := range evs {
				if strings.HasPrefix(e.Message, "alpha") {
					conn = e.Message
				}
			}
		}
		return v, conn
	}
	v, conn := restartAlpha("after the failover")
	a := v.replica("alpha")
	t.Logf("after the failover: alpha resynced %d bytes, %s by rule %s (beta's event: %q)", a.Resynced, a.Decision, a.SyncRule, conn)

	for round := 1; round <= 3; round++ {
		c.stop("alpha")
		v, conn := restartAlpha(fmt.Sprintf("clean restart %d", round))
		a := v.replica("alpha")
		t.Logf("clean restart %d: alpha resynced %d bytes, out of sync %d, %s by rule %s (beta's event: %q)",
			round, a.Resynced, a.OutOfSync, a.Decision, a.SyncRule, conn)
		if a.Resynced != 0 || a.Decision != "no-sync" || a.OutOfSync != 0 {
			t.Errorf("clean restart %d of alpha with no write in between: resynced %d bytes, %s by rule %s, %d bytes out of sync; want 0 bytes, no-sync, 0",
				round, a.Resynced, a.Decision, a.SyncRule, a.OutOfSync)
		}
	}
	compareFiles(t, c.disk("alpha"), c.disk("beta"), size)
}

// newStoppedPair runs alpha and beta until in sync, has alpha run the
// qemu-io write cmd (and a flush), and stops both cleanly.
func newStoppedPair(t *testing.T, size int64, cmd string) *procCluster {
	t.Helper()
	c := newProcCluster(t, size, 61)
	c.start("alpha")
	c.start("beta")
	c.waitInSync("alpha")
	qemuIO(t, c.uri("alpha"), cmd, "flush")
	c.waitInSync("alpha")
	c.stop("alpha")
	c.stop("beta")
	return c
}

// qemuIOEventually retries the qemu-io commands against uri until they
// succeed, for at most within; it reports how long that took.
func qemuIOEventually(t *testing.T, limit time.Duration, what, uri string, cmds ...string) time.Duration {
	t.Helper()
	began := time.Now()
	var r result
	if !within(limit, 200*time.Millisecond, func() bool {
		var ok bool
		r, ok = tryQemuIOWithin(t, 20*time.Second, uri, cmds...)
		return ok
	}) {
		t.Fatalf("%s does not serve %s %s: %s", uri, limit, what, r)
	}
	return time.Since(began)
}
