package node

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/metadata"
)

// TestLargeDiscardsAndZeroesReplicateLikeAnyWrite: NBD allows a TRIM or a
// WRITE_ZEROES of up to 4 GiB in one request (mkfs.ext4, fstrim and
// blkdiscard send such requests). On a 1 GiB volume a 512 MiB discard and
// 192 MiB and 256 MiB of zeroes replicate like any write, under protocols
// C and A: the peer stays Connected and UpToDate on the same link, nothing
// is resynced, no peer is lost, the ranges are holes on the peer too, and
// the replicas are identical.
func TestLargeDiscardsAndZeroesReplicateLikeAnyWrite(t *testing.T) {
	for _, proto := range []string{"C", "A"} {
		t.Run("protocol "+proto, func(t *testing.T) {
			const size = 1 << 30
			c := newTestCluster(t, size)
			c.cfg.Volumes[0].Protocol = proto
			c.start("alpha")
			c.start("beta")
			c.waitInSync()
			ctx := context.Background()
			a := c.vol("alpha")
			events, stop := c.nodes["alpha"].subscribe()
			defer stop()
			sess := a.peers.byName["beta"].session()
			resyncedBefore := replica(c.status(), "beta").ResyncedBytes
			// Data in every range the requests cover, and around them.
			for off := int64(0); off < size; off += 32 << 20 {
				if err := a.WriteAt(ctx, pattern(byte(off>>20), 64<<10), off+4096, false); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Trim(ctx, 0, 512<<20); err != nil {
				t.Fatalf("512 MiB discard: %v", err)
			}
			if err := a.WriteZeroes(ctx, 512<<20, 192<<20, false); err != nil {
				t.Fatalf("192 MiB of zeroes: %v", err)
			}
			if err := a.WriteZeroes(ctx, 768<<20-4096, 256<<20, true); err != nil {
				t.Fatalf("256 MiB of zeroes with FUA: %v", err)
			}
			if err := a.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if a.peers.byName["beta"].session() != sess {
				t.Fatal("the link to beta was dropped and made again")
			}
			c.waitInSync()
			r := replica(c.status(), "beta")
			if r.Disk != "UpToDate" || r.Replication != "Connected" || r.ResyncedBytes != resyncedBefore {
				t.Fatalf("beta after the discards: %s %s, %d bytes resynced; want UpToDate Connected, 0", r.Disk, r.Replication, r.ResyncedBytes-resyncedBefore)
			}
			for {
				select {
				case e := <-events:
					if e.Kind == "peer-lost" || e.Kind == "resync" {
						t.Fatalf("event %s: %s", e.Kind, e.Message)
					}
					continue
				default:
				}
				break
			}
			c.requireIdentical()
			// The discarded and zeroed ranges are holes on beta: the file
			// holds little more than the 64 KiB pieces outside them.
			var st syscall.Stat_t
			if err := syscall.Stat(c.cfg.Volumes[0].Disks["beta"].Paths[0].Path, &st); err != nil {
				t.Fatal(err)
			}
			if used := st.Blocks * 512; used > 16<<20 {
				t.Fatalf("beta's backing file uses %d bytes after 1 GiB was discarded or zeroed; want holes", used)
			}
		})
	}
}

// TestAWriteLargerThanHalfTheActivityLogCompletes: with the smallest
// activity log (7 extents of 4 MiB), a 32 MiB write (the largest NBD
// request) needs more hot extents than the log holds; it is carried out
// in pieces instead of waiting forever for room.
func TestAWriteLargerThanHalfTheActivityLogCompletes(t *testing.T) {
	c := newTestCluster(t, 64<<20)
	c.cfg.Volumes[0].ALExtents = metadata.MinALExtents
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := c.vol("alpha")
	if err := a.WriteAt(ctx, pattern(9, 32<<20), 4096, false); err != nil {
		t.Fatalf("32 MiB write with a 7-extent activity log: %v", err)
	}
	if err := a.Trim(ctx, 8<<20, 40<<20); err != nil {
		t.Fatalf("40 MiB discard with a 7-extent activity log: %v", err)
	}
	c.requireIdentical()
}
