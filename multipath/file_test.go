package multipath

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// exercise writes, zeroes and reads d through every path in turn, failing
// one path at a time by hand, and checks each read against a model. It
// returns the model, the LUN's data as the caller should find it.
func exercise(t *testing.T, d *Device, unaligned bool) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	model := make([]byte, d.Size())
	if _, err := d.ReadAt(model, 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	names := []string{}
	for _, p := range d.Paths() {
		names = append(names, p.Name)
	}
	only := func(keep int) {
		for i, n := range names {
			if i == keep {
				d.Restore(n)
			}
		}
		for i, n := range names {
			if i != keep {
				d.Fail(n)
			}
		}
	}
	for round := range 3 * len(names) {
		only(round % len(names))
		for range 20 {
			n := (1 + rng.IntN(16)) * 4096
			off := int64(rng.IntN(int(d.Size())-n-4096)) / 4096 * 4096
			if unaligned {
				n, off = n-1-rng.IntN(511), off+int64(rng.IntN(512))
			}
			for i := range buf[:n] {
				buf[i] = byte(rng.Uint32())
			}
			switch rng.IntN(4) {
			case 0:
				if err := d.Zero(off, int64(n)); err != nil {
					t.Fatal(err)
				}
				clear(model[off : off+int64(n)])
			default:
				if _, err := d.WriteAt(buf[:n], off); err != nil {
					t.Fatal(err)
				}
				copy(model[off:], buf[:n])
			}
		}
		// Read everything through the next path: it must see what the
		// previous one wrote.
		only((round + 1) % len(names))
		got := make([]byte, len(model))
		if _, err := d.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, model) {
			t.Fatalf("round %d: path %s does not read what path %s wrote", round, names[(round+1)%len(names)], names[round%len(names)])
		}
	}
	for _, n := range names {
		d.Restore(n)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	return model
}

// TestFilePaths pins real files: several handles to one file are paths to
// one LUN; what one writes, the others read; the file holds the data
// before the label.
func TestFilePaths(t *testing.T) {
	const size = 4 << 20
	file := newFile(t, size)
	var paths []Path
	for _, n := range []string{"h0", "h1", "h2"} {
		paths = append(paths, openFilePath(t, n, file))
	}
	d, err := Open(paths, Config{Label: true, Policy: RoundRobin, RRMinIO: 1})
	if err != nil {
		t.Fatal(err)
	}
	model := exercise(t, d, true)
	u := d.UUID()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data[:len(model)], model) {
		t.Error("the file does not hold what the device wrote")
	}
	if got, err := DecodeLabel(data[len(data)-LabelSize:]); err != nil || got != u {
		t.Errorf("label at the file's end: %s, %v; want %s", got, err, u)
	}
}

// TestLoopDevices pins block devices: two loop devices over one file are
// two device nodes with their own page caches; opened O_DIRECT, each
// reads what the other wrote, unaligned IO included.
func TestLoopDevices(t *testing.T) {
	if os.Geteuid() != 0 {
		missing(t, "needs root to attach loop devices (losetup): CI runs as root")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		missing(t, "losetup not found: install the Debian package util-linux (./deploy/install-test-deps.sh)")
	}
	const size = 8 << 20
	file := newFile(t, size)
	var paths []Path
	for i := range 2 {
		out, err := exec.Command("losetup", "-f", "--show", file).CombinedOutput()
		if err != nil {
			missing(t, "cannot attach a loop device: %v: %s", err, out)
		}
		dev := strings.TrimSpace(string(out))
		t.Cleanup(func() {
			if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
				t.Errorf("losetup -d %s: %v: %s", dev, err, out)
			}
		})
		p := openFilePath(t, "loop"+string(rune('0'+i)), dev)
		if !p.(*filePath).direct {
			t.Fatalf("%s is not opened O_DIRECT", dev)
		}
		paths = append(paths, p)
	}
	d, err := Open(paths, Config{Label: true, Policy: RoundRobin, RRMinIO: 1})
	if err != nil {
		t.Fatal(err)
	}
	if d.Size() != size-LabelSize {
		t.Errorf("Size = %d, want %d", d.Size(), size-LabelSize)
	}
	exercise(t, d, false)
	model := exercise(t, d, true)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data[:len(model)], model) {
		t.Error("the backing file does not hold what the device wrote")
	}
}

// missing skips a test whose precondition (root, a tool, the loop driver)
// this machine lacks, and fails it under CI=true: CI runs as root with
// every tool deploy/install-test-deps.sh installs, so there it is a
// broken setup, not a reason to test less.
func missing(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: "+format, args...)
	}
	t.Skipf(format, args...)
}
