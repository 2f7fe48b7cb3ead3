package main

// End-to-end tests of operator commands that would hurt a healthy volume:
// they are refused, say why, and change nothing.

import (
	"strings"
	"testing"
	"time"
)

// TestE2EDiscardMyDataIsRefusedOutsideASplitBrain: `connect
// --discard-my-data --yes` resolves a split brain. On a connected, in-sync
// volume it must be refused, naming the split brain it needs, and change
// nothing: the primary keeps serving, the secondary stays UpToDate.
func TestE2EDiscardMyDataIsRefusedOutsideASplitBrain(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	for _, tc := range []struct {
		name, victim string
	}{
		{"on the connected primary", "alpha"},
		{"on a connected secondary", "beta"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e2eBeside(t)
			d := startDemo(t)
			d.waitInSync("alpha")
			r := d.ctl("alpha", "connect", volName, "--discard-my-data", "--yes", "--node", tc.victim)
			t.Logf("replctl connect vol0 --discard-my-data --yes --node %s: %s", tc.victim, r)
			if r.ok() || r.code == 0 {
				t.Errorf("connect --discard-my-data --yes --node %s on an in-sync volume succeeded; want it refused (no split brain): %s", tc.victim, r)
			} else if !strings.Contains(strings.ToLower(r.out), "split") {
				t.Errorf("connect --discard-my-data --node %s was refused without naming the split brain it needs: %s", tc.victim, r)
			}

			v := d.mustStatus("alpha")
			a, b := v.replica("alpha"), v.replica("beta")
			if v.Primary != "alpha" || v.NBDURI == "" || a == nil || a.Role != "Primary" {
				t.Fatalf("after the refused discard the volume's primary is %q (nbd_uri %q, alpha %+v); want alpha, serving", v.Primary, v.NBDURI, a)
			}
			if b == nil || b.Role != "Secondary" {
				t.Fatalf("after the refused discard beta is %+v; want Secondary", b)
			}
			qemuIO(t, d.uri, "write -P 0x6d 0 1M", "flush", "read -P 0x6d 0 1M")
			v = d.waitInSync("alpha")
			if v.Primary != "alpha" {
				t.Fatalf("primary is %q, want alpha", v.Primary)
			}
			compareFiles(t, d.disk("alpha"), d.disk("beta"), demoSize)
		})
	}
}

// TestE2ESwitchoverIsRefusedWhileTheOldPrimaryHasClients: a switchover
// closes the old primary's export, so a client still attached (a mounted
// file system) would get I/O errors. `replctl primary` is refused while the
// primary has NBD clients, naming each (address, since when) and saying to
// disconnect them first; once they are gone the switchover goes ahead.
func TestE2ESwitchoverIsRefusedWhileTheOldPrimaryHasClients(t *testing.T) {
	e2e(t)
	d := startDemo(t)
	d.waitInSync("alpha")
	client, err := dialRawNBD(d.uri)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			client.close()
		}
	}()
	head, err := client.read(0, 65536)
	if err != nil {
		t.Fatal(err)
	}
	addr := client.conn.LocalAddr().String()

	r := d.ctl("alpha", "primary", volName, "--node", "beta")
	t.Logf("replctl primary vol0 --node beta with client %s attached: %s", addr, r)
	if r.ok() || r.code == 0 {
		t.Errorf("switchover with an NBD client (%s) attached to alpha succeeded; want it refused: %s", addr, r)
	} else {
		if !strings.Contains(r.out, addr) {
			t.Errorf("the refusal does not name the client %s: %s", addr, r)
		}
		if !strings.Contains(strings.ToLower(r.out), "disconnect") {
			t.Errorf("the refusal does not say to disconnect the client first: %s", r)
		}
	}
	v := d.mustStatus("alpha")
	if v.Primary != "alpha" || v.NBDURI == "" {
		t.Fatalf("after the switchover attempt the primary is %q (nbd_uri %q); want alpha, still serving", v.Primary, v.NBDURI)
	}
	got, err := client.read(0, 65536)
	if err != nil {
		t.Fatalf("the attached client cannot read after the refused switchover: %v", err)
	}
	if string(got) != string(head) {
		t.Fatalf("the attached client reads different data at offset 0 after the refused switchover")
	}

	client.close()
	closed = true
	// The server notices the close asynchronously: retry until it lets go.
	if !within(20*time.Second, 200*time.Millisecond, func() bool {
		r = d.ctl("alpha", "primary", volName, "--node", "beta")
		return r.ok()
	}) {
		t.Fatalf("switchover after the client disconnected: %s", r)
	}
	d.waitFor("beta", "beta Primary", 30*time.Second, func(v *volumeStatus) bool {
		b := v.replica("beta")
		return v.Primary == "beta" && b != nil && b.Role == "Primary"
	})
}
