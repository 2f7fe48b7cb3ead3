package multipath

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/replvol/replvol/multipath/faultpath"
)

func TestLabelRoundTrip(t *testing.T) {
	u := NewUUID()
	got, err := DecodeLabel(EncodeLabel(u))
	if err != nil || got != u {
		t.Fatalf("DecodeLabel(EncodeLabel(%s)) = %s, %v", u, got, err)
	}
	back, err := ParseUUID(u.String())
	if err != nil || back != u {
		t.Fatalf("ParseUUID(%s) = %s, %v", u, back, err)
	}
	if _, err := DecodeLabel(make([]byte, LabelSize)); !errors.Is(err, ErrNoLabel) {
		t.Errorf("zero block: %v, want ErrNoLabel", err)
	}
	b := EncodeLabel(u)
	b[100] ^= 1
	if _, err := DecodeLabel(b); !errors.Is(err, ErrCorruptLabel) {
		t.Errorf("flipped reserved bit: %v, want ErrCorruptLabel", err)
	}
	if off, err := LabelOffset(1<<20 + 100); err != nil || off != 1<<20-LabelSize {
		t.Errorf("LabelOffset(1 MiB + 100) = %d, %v: want the last whole 4 KiB block", off, err)
	}
	if _, err := LabelOffset(LabelSize + 4095); !errors.Is(err, ErrTooSmall) {
		t.Errorf("LabelOffset(8191) = %v, want ErrTooSmall", err)
	}
}

func FuzzDecodeLabel(f *testing.F) {
	f.Add(EncodeLabel(NewUUID()))
	f.Add(make([]byte, LabelSize))
	f.Add([]byte("REPLVOL-MPATH"))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := DecodeLabel(b)
		if err != nil {
			if !errors.Is(err, ErrNoLabel) && !errors.Is(err, ErrCorruptLabel) {
				t.Fatalf("error of no class: %v", err)
			}
			return
		}
		if u.IsZero() {
			t.Fatal("decoded the zero UUID")
		}
		if again, err := DecodeLabel(EncodeLabel(u)); err != nil || again != u {
			t.Fatalf("re-encoding %s: %s, %v", u, again, err)
		}
	})
}

// newFile returns the path of a new sparse file of size bytes.
func newFile(t *testing.T, size int64) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "lun")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return name
}

func openFilePath(t *testing.T, name, file string) Path {
	t.Helper()
	p, err := OpenFilePath(name, file)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOpenRefusesAnotherLUN pins path identity: Open takes only paths
// whose label names one LUN, and says which path and which UUIDs differ.
func TestOpenRefusesAnotherLUN(t *testing.T) {
	const size = 1 << 20
	lunA, lunB := newFile(t, size), newFile(t, size)
	uA, uB := NewUUID(), NewUUID()

	t.Run("an unlabelled LUN is refused unless Open may label it", func(t *testing.T) {
		if _, err := Open([]Path{openFilePath(t, "a0", lunA)}, Config{}); !errors.Is(err, ErrNoLabel) {
			t.Fatalf("Open = %v, want ErrNoLabel", err)
		}
		d, err := Open([]Path{openFilePath(t, "a0", lunA), openFilePath(t, "a1", lunA)}, Config{Label: true, UUID: uA})
		if err != nil {
			t.Fatal(err)
		}
		if d.UUID() != uA || d.Size() != size-LabelSize {
			t.Errorf("labelled device: UUID %s size %d, want %s and %d", d.UUID(), d.Size(), uA, size-LabelSize)
		}
		d.Close()
		p := openFilePath(t, "check", lunA)
		defer p.Close()
		if u, err := ReadLabel(p); err != nil || u != uA {
			t.Errorf("ReadLabel after Open = %s, %v", u, err)
		}
	})
	pB := openFilePath(t, "b0", lunB)
	if err := WriteLabel(pB, uB); err != nil {
		t.Fatal(err)
	}
	pB.Close()

	t.Run("a path carrying another LUN's label is refused, naming both", func(t *testing.T) {
		_, err := Open([]Path{openFilePath(t, "a0", lunA), openFilePath(t, "b0", lunB)}, Config{})
		if !errors.Is(err, ErrLabelMismatch) {
			t.Fatalf("Open = %v, want ErrLabelMismatch", err)
		}
		for _, want := range []string{"b0", uA.String(), uB.String()} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name %s", err, want)
			}
		}
	})
	t.Run("the configured UUID must match", func(t *testing.T) {
		_, err := Open([]Path{openFilePath(t, "b0", lunB)}, Config{UUID: uA})
		if !errors.Is(err, ErrLabelMismatch) || !strings.Contains(err.Error(), uB.String()) {
			t.Fatalf("Open = %v, want ErrLabelMismatch naming %s", err, uB)
		}
	})
	t.Run("an unlabelled path among labelled ones is refused", func(t *testing.T) {
		blank := newFile(t, size)
		_, err := Open([]Path{openFilePath(t, "a0", lunA), openFilePath(t, "blank", blank)}, Config{Label: true})
		if !errors.Is(err, ErrLabelMismatch) || !errors.Is(err, ErrNoLabel) || !strings.Contains(err.Error(), "blank") {
			t.Fatalf("Open = %v, want ErrLabelMismatch and ErrNoLabel naming path blank", err)
		}
	})
	t.Run("paths of different sizes are refused", func(t *testing.T) {
		other := newFile(t, 2*size)
		_, err := Open([]Path{openFilePath(t, "a0", lunA), openFilePath(t, "big", other)}, Config{})
		if !errors.Is(err, ErrLabelMismatch) || !strings.Contains(err.Error(), "big") {
			t.Fatalf("Open = %v, want ErrLabelMismatch naming path big", err)
		}
	})
	t.Run("a corrupt label is refused", func(t *testing.T) {
		bad := newFile(t, size)
		p := openFilePath(t, "bad", bad)
		if err := WriteLabel(p, uB); err != nil {
			t.Fatal(err)
		}
		if _, err := p.WriteAt([]byte{0xff}, size-LabelSize+40); err != nil {
			t.Fatal(err)
		}
		p.Close()
		_, err := Open([]Path{openFilePath(t, "bad", bad)}, Config{Label: true})
		if !errors.Is(err, ErrCorruptLabel) {
			t.Fatalf("Open = %v, want ErrCorruptLabel", err)
		}
	})
	t.Run("a path that does not answer starts FAIL", func(t *testing.T) {
		dead := faultpath.New(openFilePath(t, "a1", lunA))
		dead.SetInjector(faultpath.Always(faultpath.Fault{Err: faultpath.ErrInjected}))
		d, err := Open([]Path{openFilePath(t, "a0", lunA), dead}, Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ps := d.Paths()
		if ps[0].State != Active || ps[1].State != Fail || !strings.Contains(ps[1].Reason, "injected") {
			t.Errorf("states %s (%s), %s (%s); want ACTIVE, FAIL for the injected error",
				ps[0].State, ps[0].Reason, ps[1].State, ps[1].Reason)
		}
	})
}

// TestUsableSize pins that the label is out of the data's reach.
func TestUsableSize(t *testing.T) {
	const size = 1<<20 + 512 // not a whole number of 4 KiB blocks
	d, err := Open([]Path{openFilePath(t, "p0", newFile(t, size))}, Config{Label: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	end := int64(1<<20 - LabelSize)
	if d.Size() != end {
		t.Fatalf("Size = %d, want %d", d.Size(), end)
	}
	if _, err := d.WriteAt(make([]byte, 2), end-1); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("write across the end: %v, want ErrOutOfRange", err)
	}
	if err := d.Zero(end-4096, 8192); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("zero across the end: %v, want ErrOutOfRange", err)
	}
	buf := make([]byte, 8192)
	if n, err := d.ReadAt(buf, end-4096); n != 4096 || err != io.EOF {
		t.Errorf("read across the end = %d, %v; want 4096, EOF", n, err)
	}
	if n, err := d.ReadAt(buf, end); n != 0 || err != io.EOF {
		t.Errorf("read at the end = %d, %v; want 0, EOF", n, err)
	}
	if u, err := ReadLabel(openFilePath(t, "check", d.paths[0].path.(*filePath).f.Name())); err != nil || u != d.UUID() {
		t.Errorf("label after IO = %s, %v", u, err)
	}
}
