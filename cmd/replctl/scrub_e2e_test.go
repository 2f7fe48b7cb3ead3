package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// flipBlocks flips two bytes inside each given 4 KiB block of the file
// at path.
func flipBlocks(t *testing.T, path string, blocks []int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, b := range blocks {
		p := make([]byte, 2)
		off := b*4096 + 1000
		if _, err := f.ReadAt(p, off); err != nil {
			t.Fatal(err)
		}
		p[0], p[1] = ^p[0], ^p[1]
		if _, err := f.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
	}
}

// TestE2EScrubRepairsTheSecondary is issue 29's done-means test of the
// scrub: 100 scattered blocks corrupted in the secondary's backing file
// under a running demo: replctl scrub vol0 --wait exits 0 and says all
// 100 were repaired, replctl verify then finds nothing out of sync, and
// the backing files' data areas are equal. The same block corrupted on
// both replicas: scrub --wait exits 6 (documented in --help) and names
// none repaired; once the range is written again a scrub exits 0.
func TestE2EScrubRepairsTheSecondary(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	d := startDemo(t)
	v := d.waitInSync("alpha")
	for _, node := range []string{"alpha", "beta"} {
		if in := v.replica(node).Integrity; in == nil || !in.Checksums {
			t.Fatalf("replctl status --json: %s's replica has integrity %+v; want checksums true (replctl demo's default)", node, in)
		}
	}
	qemuIO(t, d.uri, "write -P 0x5a 0 32M", "flush")
	d.waitInSync("alpha")

	var blocks []int64
	for i := range int64(100) {
		blocks = append(blocks, 3+i*79) // scattered over the 32 MiB written
	}
	flipBlocks(t, d.disk("beta"), blocks)
	r := runCmd(3*time.Minute, nil, replctlBin, d.ctlArgs("alpha", []string{"scrub", volName, "--wait", "--rate", "256MiB"})...)
	t.Logf("replctl scrub vol0 --wait: %s", r)
	if !r.ok() || !strings.Contains(r.out, "100 repaired, 0 unrecoverable") {
		t.Fatalf("replctl scrub vol0 --wait: %s; want exit 0 and 100 repaired", r)
	}
	if in := d.mustStatus("alpha").replica("beta").Integrity; in == nil || in.RepairedBlocks != 100 {
		t.Fatalf("replctl status --json after the scrub: beta's integrity %+v; want repaired_blocks 100", in)
	}
	r = runCmd(90*time.Second, nil, replctlBin, d.ctlArgs("alpha", []string{"verify", volName, "--wait"})...)
	if !r.ok() || !strings.Contains(r.out, " 0B out of sync") {
		t.Fatalf("replctl verify vol0 --wait after the scrub: %s", r)
	}
	compareFiles(t, d.disk("alpha"), d.disk("beta"), 256<<20)

	const both = 1000
	flipBlocks(t, d.disk("alpha"), []int64{both})
	flipBlocks(t, d.disk("beta"), []int64{both})
	r = runCmd(3*time.Minute, nil, replctlBin, d.ctlArgs("alpha", []string{"scrub", volName, "--wait", "--rate", "256MiB"})...)
	t.Logf("replctl scrub vol0 --wait, a block bad on both: %s", r)
	if r.code != exitUnrecoverable || !strings.Contains(r.out, "0 repaired, 2 unrecoverable") {
		t.Fatalf("replctl scrub vol0 --wait with a block bad on both replicas: %s; want exit %d and it counted on both nodes", r, exitUnrecoverable)
	}
	v = d.mustStatus("alpha")
	for _, node := range []string{"alpha", "beta"} {
		if in := v.replica(node).Integrity; in == nil || in.UnrecoverableBlocks != 1 {
			t.Fatalf("replctl status --json after the scrub: %s's integrity %+v; want unrecoverable_blocks 1", node, in)
		}
	}
	qemuIO(t, d.uri, "write -P 0x33 4096000 4096", "flush")
	// The write clears it on both: the primary's write and the
	// secondary's apply of it.
	d.waitFor("alpha", "unrecoverable_blocks 0 on both replicas", time.Minute, func(v *volumeStatus) bool {
		for _, node := range []string{"alpha", "beta"} {
			if in := v.replica(node).Integrity; in == nil || in.UnrecoverableBlocks != 0 {
				return false
			}
		}
		return true
	})
	r = runCmd(3*time.Minute, nil, replctlBin, d.ctlArgs("alpha", []string{"scrub", volName, "--wait", "--rate", "256MiB"})...)
	if !r.ok() || !strings.Contains(r.out, "0 repaired, 0 unrecoverable") {
		t.Fatalf("replctl scrub vol0 --wait once the bad range was written again: %s", r)
	}
	d.waitInSync("alpha")
	compareFiles(t, d.disk("alpha"), d.disk("beta"), 256<<20)
}

// TestE2EDemoWithoutChecksums: replctl demo --checksums off lays out the
// metadata without the checksum area: status says checksums false on
// both replicas, and a scrub is refused with the reason, the volume
// serving as before.
func TestE2EDemoWithoutChecksums(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	d := startDemo(t, "--checksums", "off")
	v := d.waitInSync("alpha")
	for _, node := range []string{"alpha", "beta"} {
		if in := v.replica(node).Integrity; in == nil || in.Checksums {
			t.Fatalf("replctl status --json: %s's replica has integrity %+v; want checksums false", node, in)
		}
	}
	r := runCmd(time.Minute, nil, replctlBin, d.ctlArgs("alpha", []string{"scrub", volName})...)
	if r.ok() || !strings.Contains(r.out, "keeps no checksums") {
		t.Fatalf("replctl scrub vol0 without checksums: %s; want it refused, saying the volume keeps no checksums", r)
	}
	qemuIO(t, d.uri, "write -P 0x5a 0 4M", "flush", "read -P 0x5a 0 4M")
}

// TestE2EARottenBlockOnThePrimaryIsReadRightAndRepaired is issue 29's
// done-means test of a verified read under a running demo: two bytes
// flipped inside a written block of the primary's backing file; an NBD
// read of that block returns the data that was written, an event
// block-repaired and the replica's repaired_blocks say it came from beta
// because of its checksum, and the file holds the written bytes again.
func TestE2EARottenBlockOnThePrimaryIsReadRightAndRepaired(t *testing.T) {
	e2eBeside(t)
	RequireTool(t, "qemu-io", "qemu-utils")
	d := startDemo(t)
	d.waitInSync("alpha")
	qemuIO(t, d.uri, "write -P 0x3c 0 1M", "flush")
	d.waitInSync("alpha")

	since := time.Now().Add(-50 * time.Millisecond).Format(time.RFC3339Nano)
	events := startBG(t, nil, "events", "--json", "--since", since, "--addr", d.nodes["alpha"].Control)
	const block = 10
	flipBlocks(t, d.disk("alpha"), []int64{block})
	qemuIO(t, d.uri, fmt.Sprintf("read -P 0x3c %d 4096", block*4096))

	events.waitFor("a block-repaired event", 15*time.Second, func() bool {
		for _, e := range eventLines(t, events.out()) {
			if e["kind"] == "block-repaired" {
				return true
			}
		}
		return false
	})
	for _, e := range eventLines(t, events.out()) {
		if e["kind"] != "block-repaired" {
			continue
		}
		if e["peer"] != "beta" || e["reason"] != "checksum" || e["offset"] != float64(block*4096) || e["length"] != float64(4096) {
			t.Fatalf("block-repaired event %v: want the block at byte %d (4096 bytes) from beta, cause checksum", e, block*4096)
		}
	}
	if in := d.mustStatus("alpha").replica("alpha").Integrity; in == nil || in.RepairedBlocks != 1 {
		t.Fatalf("replctl status --json: alpha's integrity %+v; want repaired_blocks 1", in)
	}
	f, err := os.Open(d.disk("alpha"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, 4096)
	if _, err := f.ReadAt(got, block*4096); err != nil {
		t.Fatal(err)
	}
	if want := bytes.Repeat([]byte{0x3c}, 4096); !bytes.Equal(got, want) {
		t.Fatal("alpha's backing file does not hold the written block again")
	}
}
