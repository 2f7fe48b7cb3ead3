package backing

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestFileDiskWritesLargeBuffersWhole: a write larger than one write
// syscall (maxWriteChunk) lands whole, at an unaligned offset too, and
// nothing around it changes.
func TestFileDiskWritesLargeBuffersWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.img")
	const size = 1 << 20
	if err := os.WriteFile(path, bytes.Repeat([]byte{0xee}, size), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDisk(path, size)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const off = 4096 + 17
	p := make([]byte, 3*maxWriteChunk+123)
	for i := range p {
		p[i] = 5 + byte(i%251)
	}
	if n, err := d.WriteAt(p, off); err != nil || n != len(p) {
		t.Fatalf("WriteAt: %d, %v", n, err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0xee}, size)
	copy(want[off:], p)
	if !bytes.Equal(got, want) {
		t.Fatal("the file does not hold exactly the write")
	}
}
