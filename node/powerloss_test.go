package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/internal/blocksum"
	"github.com/replvol/replvol/internal/fault"
	"github.com/replvol/replvol/metadata"
)

// TestAPowerLossOfTheSecondaryResyncsItsActivityLog: beta acknowledges
// writes once they are in its page cache. A power loss then takes some
// away, unflushed; beta comes back after the reboot, resyncs its activity
// log's extents from alpha, and the disks are equal again. A crash of
// the process alone after a FLUSH (the same boot: the page cache kept the
// writes) resyncs nothing.
func TestAPowerLossOfTheSecondaryResyncsItsActivityLog(t *testing.T) {
	beside(t)
	const size = 16 << 20
	c := newTestCluster(t, size)
	// beta's disk has a volatile cache: what it acknowledged since its
	// last sync (but a write with FUA) a power loss takes away.
	var vd atomic.Pointer[fault.Disk]
	opts := Options{OpenDisk: openFaulty(func(d *fault.Disk) {
		d.Add(fault.On(fault.Write, fault.Zero).Lose())
		vd.Store(d)
	})}
	c.opts["beta"] = opts
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")

	// A crash of the process after a FLUSH: nothing is lost, nothing is
	// resynced. (Without the FLUSH alpha resyncs what beta acknowledged
	// since its last flush: it cannot tell a crash of beta's process from
	// a power loss.)
	writeRandomBlocks(t, a, 50, 8)
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.crash("beta")
	c.start("beta")
	c.waitInSync()
	if moved := c.vol("beta").counters.resynced.Load(); moved != 0 {
		t.Fatalf("beta's process crashed (no reboot) and %d bytes were resynced, want 0", moved)
	}
	c.requireIdentical()

	// A power loss: the writes beta acknowledged since its last sync go.
	writeRandomBlocks(t, a, 200, 7)
	c.crash("beta")
	path := c.cfg.Volumes[0].Disks["beta"].Paths[0].Path
	if lost := loseUnsynced(t, vd.Load(), path); lost == 0 {
		t.Fatal("beta had no unsynced write to lose: the test shows nothing")
	}
	if bytes.Equal(c.disk("alpha")[:size], c.disk("beta")[:size]) {
		t.Fatal("beta's disk lost nothing: the test shows nothing")
	}
	opts.bootID = "after-a-reboot"
	c.opts["beta"] = opts
	c.start("beta")
	c.waitInSync()
	c.requireIdentical()
	evs, err := c.nodes["beta"].store.Events(50)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs {
		found = found || (e.Kind == "crashed-secondary" && strings.Contains(e.Message, "resynced from the primary"))
	}
	if !found {
		t.Fatal("no crashed-secondary event on beta")
	}
}

// The power-loss harness of issue 29: a power loss of one node mid-write,
// its disk's volatile cache taking back what it had not synced, torn at
// any sector, with checksums on; afterwards nothing may be reported as
// repaired or unrecoverable, and no write the client was promised is lost.

// powerLossBlocks is the harness's volume in 4 KiB blocks: 64 MiB,
// sixteen extents of the activity log, which holds seven
// (metadata.MinALExtents), so that writes all over the volume evict
// extents all the time, and with them make their checksums durable, and
// that after a crash most blocks lie outside the log, where nothing
// computes or resyncs their sums again.
const powerLossBlocks = 16384

// blockLedger is what the client was told of each block: the data of its
// last acknowledged write, whether that write is durable by the client's
// rules (FUA, or a FLUSH sent after it completed), and whether a later
// write was started whose outcome the client never learned (the block
// may then hold either, or a mix).
type blockLedger struct {
	mu        sync.Mutex
	acked     map[int64][]byte
	protected map[int64]bool
	unknown   map[int64]bool
	acks      int
}

func newBlockLedger() *blockLedger {
	return &blockLedger{acked: map[int64][]byte{}, protected: map[int64]bool{}, unknown: map[int64]bool{}}
}

func (l *blockLedger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acks
}

// writeUntilCanceled writes single blocks of its own (those equal to
// writer modulo writers) through v until ctx ends or a request fails,
// FUA now and then, with a FLUSH every few writes, recording each outcome
// in l. Few FLUSHes, so that a disk's cache holds much when the power
// goes.
func writeUntilCanceled(ctx context.Context, v *Volume, l *blockLedger, writer, writers int, seed uint64) {
	r := rand.New(rand.NewPCG(seed, uint64(writer)))
	var mine []int64 // acknowledged since this writer's last FLUSH
	for i := 0; ctx.Err() == nil; i++ {
		b := int64(r.IntN(powerLossBlocks/writers)*writers + writer)
		data := make([]byte, 4096)
		for j := range data {
			data[j] = byte(r.Uint32())
		}
		fua := r.IntN(8) == 0
		l.mu.Lock()
		l.unknown[b] = true
		l.mu.Unlock()
		if err := v.WriteAt(ctx, data, b*4096, fua); err != nil {
			return
		}
		l.mu.Lock()
		l.acked[b], l.protected[b], l.acks = data, fua, l.acks+1
		delete(l.unknown, b)
		l.mu.Unlock()
		mine = append(mine, b)
		if i%40 != 39 {
			continue
		}
		if err := v.Flush(ctx); err != nil {
			return
		}
		l.mu.Lock()
		for _, b := range mine {
			if !l.unknown[b] {
				l.protected[b] = true
			}
		}
		l.mu.Unlock()
		mine = mine[:0]
	}
}

// errPowerCut is what an operation of a disk whose power was cut gets,
// once its node is down.
var errPowerCut = errors.New("the power of this disk was cut")

// powerCut is a disk whose power can be cut while its node runs: from
// the cut on, no operation reaches the disk; each waits until the node is
// down (after which nothing it does reaches stable storage) and fails.
// cut returns once the operations under way have ended, so that none
// lands after it.
type powerCut struct {
	Disk
	mu   sync.RWMutex
	off  bool
	down chan struct{}
	// syncs counts the syncs and FUA writes done: each may make what the
	// cache holds smaller.
	syncs atomic.Int64
}

func newPowerCut(d Disk) *powerCut { return &powerCut{Disk: d, down: make(chan struct{})} }

// do runs op unless the power is cut.
func (p *powerCut) do(op func() error) error {
	p.mu.RLock()
	if p.off {
		p.mu.RUnlock()
		<-p.down
		return errPowerCut
	}
	defer p.mu.RUnlock()
	return op()
}

// cutIf cuts the power if ready, and no sync or FUA write ended since
// it was asked, once every operation under way has ended; it reports
// whether it did. (ready may take the locks of the disks around this
// one, which may wait for this one's: it is asked before.)
func (p *powerCut) cutIf(ready func() bool) bool {
	seen := p.syncs.Load()
	if !ready() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.off = p.syncs.Load() == seen
	return p.off
}

// nodeDown fails the operations the cut holds, and every later one.
func (p *powerCut) nodeDown() { close(p.down) }

func (p *powerCut) ReadAt(b []byte, off int64) (n int, err error) {
	err = p.do(func() (err error) { n, err = p.Disk.ReadAt(b, off); return err })
	return n, err
}

func (p *powerCut) WriteAt(b []byte, off int64) (n int, err error) {
	err = p.do(func() (err error) { n, err = p.Disk.WriteAt(b, off); return err })
	return n, err
}

func (p *powerCut) WriteAtSync(b []byte, off int64) error {
	return p.do(func() error {
		defer p.syncs.Add(1)
		return backing.WriteSync(p.Disk, b, off)
	})
}

func (p *powerCut) Sync() error {
	return p.do(func() error {
		defer p.syncs.Add(1)
		return p.Disk.Sync()
	})
}

func (p *powerCut) Zero(off, length int64) error {
	return p.do(func() error { return p.Disk.Zero(off, length) })
}

func (p *powerCut) IsHole(off, length int64) bool {
	h, ok := p.Disk.(interface{ IsHole(off, length int64) bool })
	return ok && h.IsHole(off, length)
}

// powerLossCluster is alpha and beta on the harness's volume, with
// internal or external metadata, and victim's disk behind a volatile
// cache (each write it does not sync, but FUA, a power loss may take
// back).
func powerLossCluster(t *testing.T, external bool, victim string) (*testCluster, *victimDisk) {
	const size = powerLossBlocks * 4096
	c := newTestCluster(t, size)
	c.cfg.Volumes[0].ALExtents = metadata.MinALExtents
	if external {
		c.useExternalMetadata(size, metadata.MinALExtents, true)
	}
	vd := &victimDisk{}
	c.opts[victim] = Options{OpenDisk: func(path string, size int64) (Disk, error) {
		d, err := OpenDisk(path, size)
		if err != nil {
			return nil, err
		}
		power := newPowerCut(d)
		fd := fault.NewDisk(power)
		fd.Add(fault.On(fault.Write, fault.Zero).Lose())
		vd.power.Store(power)
		vd.cache.Store(fd)
		return fd, nil
	}}
	began := time.Now()
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	t.Logf("in sync after %v", time.Since(began).Round(time.Millisecond))
	for _, name := range []string{"alpha", "beta"} {
		if on, _, _ := c.integrityOf(name); !on {
			t.Fatalf("%s keeps no checksums: the harness would show nothing", name)
		}
	}
	return c, vd
}

// victimDisk is the disk the victim of a power loss runs on now: its
// volatile cache, and its power.
type victimDisk struct {
	cache atomic.Pointer[fault.Disk]
	power atomic.Pointer[powerCut]
}

// powerLoss runs the client's writers on alpha, the primary, and cuts
// victim's power once they have had acks writes acknowledged and its
// disk holds at least four blocks unsynced: the disk takes no operation
// from then on, the node crashes with the writers still running, and its
// disk's cache takes back each sector it had not synced with a chance of
// one half (so writes are lost, kept, or torn). While the victim is down alpha (if it is the
// victim's peer) takes more writes; then the writers stop, the victim
// boots again (a new boot id: its page cache is gone) and the two are
// waited in sync. It returns the ledger and how many sectors the power
// loss took back (a fault.Disk's Sync ends its cache after the disk it
// wraps synced, so one may race the cut and leave none: the callers
// require some over their runs).
func powerLoss(t *testing.T, c *testCluster, vd *victimDisk, victim string, acks int, seed uint64) (*blockLedger, int) {
	const writers = 4
	l := newBlockLedger()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	v := c.vol("alpha")
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			writeUntilCanceled(ctx, v, l, w, writers, seed)
		}()
	}
	// The power goes with writes in flight, once the victim's cache holds
	// at least four blocks it has not synced.
	// The power goes: the disk takes nothing more, and what the node
	// does until it is down fails.
	power := vd.power.Load()
	if !within(60*time.Second, time.Millisecond, func() bool {
		return l.count() >= acks && power.cutIf(func() bool { return vd.cache.Load().Unsynced() >= 32 })
	}) {
		t.Fatalf("%d writes acknowledged, %d sectors unsynced on %s, after a minute", l.count(), vd.cache.Load().Unsynced(), victim)
	}
	began := time.Now()
	c.crashThen(victim, power.nodeDown)
	if victim != "alpha" {
		// alpha goes on without its peer for a while.
		more := l.count() + 50
		if !within(60*time.Second, time.Millisecond, func() bool { return l.count() >= more }) {
			t.Fatalf("alpha acknowledged no writes with %s down", victim)
		}
	}
	cancel()
	wg.Wait()
	r := rand.New(rand.NewPCG(seed, 77))
	f, err := os.OpenFile(c.cfg.Volumes[0].Disks[victim].Paths[0].Path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	lost, err := vd.cache.Load().LoseUnsyncedTorn(f, func(int64) bool { return r.IntN(2) == 0 })
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d: %s lost power after %d writes acknowledged; its cache took back %d sectors", seed, victim, acks, lost)
	opts := c.opts[victim]
	opts.bootID = fmt.Sprintf("after-power-loss-%d", seed)
	c.opts[victim] = opts
	c.start(victim)
	c.waitInSync()
	t.Logf("%s back in sync %v after the power loss", victim, time.Since(began).Round(time.Millisecond))
	return l, lost
}

// requireNoFalseCorruption checks what a power loss must leave: the disks
// identical, every block the ledger knows holding what the client may
// read there (durable: every write acknowledged FUA or before a FLUSH;
// all: every acknowledged write, when the primary never crashed), its
// checksum on both nodes matching it where known (known for most: a page
// the power loss tore holds none); a read of the whole
// volume through the primary and a scrub of each node that find nothing;
// and no block-repaired or block-unrecoverable event or count anywhere.
// It returns the blocks checked whose sums are known on both nodes.
func requireNoFalseCorruption(t *testing.T, c *testCluster, l *blockLedger, all bool) (verified []int64) {
	t.Helper()
	ctx := context.Background()
	c.requireIdentical()
	v := c.vol("alpha")
	seed := blocksum.NewSeed(c.cfg.Volumes[0].VolumeUUID())
	checked := 0
	l.mu.Lock()
	defer l.mu.Unlock()
	for b, want := range l.acked {
		if l.unknown[b] || (!all && !l.protected[b]) {
			continue
		}
		checked++
		got := make([]byte, 4096)
		if err := v.ReadAt(ctx, got, b*4096); err != nil {
			t.Fatalf("read of block %d: %v", b, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("block %d does not hold its last acknowledged write (protected %v)", b, l.protected[b])
		}
		both := true
		for _, name := range []string{"alpha", "beta"} {
			sums, _ := c.vol(name).durable.md.Checksums()
			sum, known, err := sums.Get(b)
			if err != nil || (known && sum != seed.Sum(uint64(b), want)) {
				t.Fatalf("%s: block %d: sum %08x (%v), want %08x", name, b, sum, err, seed.Sum(uint64(b), want))
			}
			both = both && known
		}
		if both {
			verified = append(verified, b)
		}
	}
	// A checksum page the power loss tore holds no known sum (990 blocks,
	// verified again once written): most must be known.
	if checked < 100 || len(verified) < checked*4/5 {
		t.Fatalf("%d blocks to check, %d of them with known sums on both nodes: the run shows little", checked, len(verified))
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < powerLossBlocks*4096; off += int64(len(buf)) {
		if err := v.ReadAt(ctx, buf, off); err != nil {
			t.Fatalf("read of the volume at %d: %v", off, err)
		}
	}
	began := time.Now()
	for _, name := range []string{"alpha", "beta"} {
		if _, err := c.vol(name).scrubCommand(0, false, false, false, false); err != nil {
			t.Fatalf("%s: start the scrub: %v", name, err)
		}
	}
	defer func() { t.Logf("scrubs took %v", time.Since(began).Round(time.Millisecond)) }()
	for _, name := range []string{"alpha", "beta"} {
		if st := c.waitScrubFinished(t, name); st.LastRepaired != 0 || st.LastUnrecoverable != 0 {
			t.Fatalf("%s: the scrub after the power loss found damage: %+v", name, st)
		}
		if on, repaired, unrecoverable := c.integrityOf(name); !on || repaired != 0 || unrecoverable != 0 {
			t.Fatalf("%s: checksums %v, %d blocks repaired, %d unrecoverable after a power loss; want none", name, on, repaired, unrecoverable)
		}
		evs, err := c.nodes[name].store.Events(1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Kind == "block-repaired" || e.Kind == "block-unrecoverable" {
				t.Fatalf("%s: event %s after a power loss: %s", name, e.Kind, e.Message)
			}
		}
	}
	return verified
}

// requireAFlipIsFound flips a byte of one of blocks (written, with known
// sums) on name's disk and scrubs it: exactly that block is repaired. It
// shows that the checks above would have seen a block that lost its
// sum's data.
func requireAFlipIsFound(t *testing.T, c *testCluster, blocks []int64, name string) {
	t.Helper()
	slices.Sort(blocks)
	flipFileBytes(t, c.cfg.Volumes[0].Disks[name].Paths[0].Path, blocks[len(blocks)/2]*4096+99, 1)
	if _, err := c.vol(name).scrubCommand(0, false, false, false, false); err != nil {
		t.Fatal(err)
	}
	if st := c.waitScrubFinished(t, name); st.LastRepaired != 1 || st.LastUnrecoverable != 0 {
		t.Fatalf("%s: a scrub after one flipped byte: %+v, want 1 block repaired", name, st)
	}
	c.requireIdentical()
}

// requireSomethingLost fails t when its power losses took back no sector
// at all: the runs showed nothing.
func requireSomethingLost(t *testing.T, sectors *int) {
	if !t.Failed() && *sectors == 0 {
		t.Error("no power loss took back an unsynced sector: the runs show nothing")
	}
}

// TestAPowerLossOfTheSecondaryMidWriteReportsNoCorruption: beta loses
// power while alpha's clients write (with FUA and FLUSHes), its volatile
// cache tearing what it had not synced, with internal and with external
// metadata, over several seeds. Once beta is back and resynced, the disks
// are equal, every acknowledged write reads back, every block's checksum
// is known and matches on both nodes, and no read or scrub reports a
// block repaired or unrecoverable: the blocks beta may have lost are its
// activity log's, whose sums it computes again from what it holds before
// anything reads them, and the resync brings alpha's data and sums. A
// flipped byte at the end is found by the same scrub.
func TestAPowerLossOfTheSecondaryMidWriteReportsNoCorruption(t *testing.T) {
	beside(t)
	powerLossRuns(t, "beta", true)
}

// TestAPowerLossOfThePrimaryMidWriteReportsNoCorruption: the same for a
// power loss of alpha, the primary, with its own clients' writes in
// flight. It comes back as primary, its activity log's extents resynced
// to beta; every write acknowledged FUA or before a FLUSH reads back, and
// nothing is reported repaired or unrecoverable.
func TestAPowerLossOfThePrimaryMidWriteReportsNoCorruption(t *testing.T) {
	beside(t)
	powerLossRuns(t, "alpha", false)
}

// powerLossRuns cuts node's power mid-write, with internal and with
// external metadata, over two seeds, and checks what the two tests above
// say (secondary: node is the secondary); the first seed also flips a
// byte, which the scrub must find. Some sectors must have been lost.
func powerLossRuns(t *testing.T, node string, secondary bool) {
	sectors := 0
	defer requireSomethingLost(t, &sectors)
	for _, external := range []bool{false, true} {
		for seed := uint64(1); seed <= 2; seed++ {
			t.Run(fmt.Sprintf("external=%v/seed=%d", external, seed), func(t *testing.T) {
				c, vd := powerLossCluster(t, external, node)
				l, lost := powerLoss(t, c, vd, node, 150+int(seed)*100, seed)
				sectors += lost
				verified := requireNoFalseCorruption(t, c, l, secondary)
				if seed == 1 {
					requireAFlipIsFound(t, c, verified, node)
				}
			})
		}
	}
}
