package nbd_test

import (
	"sync/atomic"
	"testing"

	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

// growingExport is an export whose size grows, as a volume's does in an
// online resize; its bytes are those of a MemExport of the largest size.
type growingExport struct {
	*nbdtest.MemExport
	size atomic.Int64
}

func (g *growingExport) Size() int64 { return g.size.Load() }

// TestAConnectionKeepsTheSizeItWasToldAndANewOneSeesTheNew: NBD cannot
// tell a connected client that the export grew, so a connection keeps the
// size of its handshake (a write past it is refused, ENOSPC, and never
// reaches the export); a connection made after the growth sees the new
// size and reaches the whole export.
func TestAConnectionKeepsTheSizeItWasToldAndANewOneSeesTheNew(t *testing.T) {
	const small, big = 1 << 20, 4 << 20
	g := &growingExport{MemExport: nbdtest.NewMemExport(big)}
	g.size.Store(small)
	s := startServer(t, map[string]nbd.Export{"vol": g})

	_, before, err := s.greet(t, nbdtest.ClientFixedNewstyle).Go("vol")
	if err != nil || before.Size != small {
		t.Fatalf("before the growth: size %d, %v; want %d", before.Size, err, small)
	}
	old := s.dial(t, "vol")
	g.size.Store(big)

	wantErrno(t, old.Write(small, pattern(4096, 1), 0), nbdtest.ENOSPC)
	if err := old.Write(small-4096, pattern(4096, 2), 0); err != nil {
		t.Fatalf("the old connection, inside its size: %v", err)
	}
	_, after, err := s.greet(t, nbdtest.ClientFixedNewstyle).Go("vol")
	if err != nil || after.Size != big {
		t.Fatalf("after the growth: size %d, %v; want %d", after.Size, err, big)
	}
	fresh := s.dial(t, "vol")
	if err := fresh.Write(big-4096, pattern(4096, 3), 0); err != nil {
		t.Fatalf("a new connection, past the old size: %v", err)
	}
	if got, err := fresh.Read(big-4096, 4096); err != nil || string(got) != string(pattern(4096, 3)) {
		t.Fatalf("read back past the old size: %v", err)
	}
}
