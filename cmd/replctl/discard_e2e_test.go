package main

import (
	"syscall"
	"testing"
	"time"
)

// TestE2ELargeDiscardsAndZeroesKeepThePeerInSync: qemu-io sends a 512 MiB
// discard, 192 MiB of zeroes and 256 MiB of zeroes that may be unmapped to
// a 1 GiB volume, each as one NBD request (NBD allows up to 4 GiB; mkfs,
// fstrim and blkdiscard send such requests). beta stays UpToDate and
// Connected throughout, nothing is resynced, no peer is lost, the ranges
// are holes on beta too, and the two disks are identical.
func TestE2ELargeDiscardsAndZeroesKeepThePeerInSync(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	const size = 1 << 30
	d := startDemo(t, "--size", "1GiB")
	start := time.Now()
	before := d.waitInSync("alpha").replica("beta").Resynced
	qemuIO(t, d.uri,
		"write -P 0x5a 0 1M", "write -P 0x5b 600M 1M", "write -P 0x5c 900M 1M",
		"discard 0 512M",
		"write -z 512M 192M",
		"write -z -u 768M 256M",
		"flush")
	v := d.mustStatus("alpha")
	if !v.inSync() {
		t.Fatalf("after the discards and zeroes the replicas are not in sync: %+v", v.Replicas)
	}
	if r := v.replica("beta"); r.Resynced != before {
		t.Fatalf("beta was resynced %d bytes by the discards; want none", r.Resynced-before)
	}
	lv, err := fetchLocalView("alpha", d.nodes["alpha"].Control)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"peer-lost", "resync"} {
		if evs := lv.eventsOf(kind, start); len(evs) > 0 {
			t.Fatalf("alpha's %s event during the discards: %s", kind, evs[0].Message)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(d.disk("beta"), &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > 64<<20 {
		t.Errorf("beta's backing file holds %d bytes after 1 GiB was discarded or zeroed; want holes", used)
	}
	compareFiles(t, d.disk("alpha"), d.disk("beta"), size)
}
