package fault

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// memDisk is an in-memory Inner.
type memDisk struct {
	mu     sync.Mutex
	data   []byte
	syncs  int
	closed bool
}

func newMemDisk(size int) *memDisk { return &memDisk{data: make([]byte, size)} }

func (m *memDisk) ReadAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := copy(p, m.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *memDisk) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return copy(m.data[off:], p), nil
}

func (m *memDisk) Sync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.syncs++
	return nil
}

func (m *memDisk) Zero(off, length int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.data[off : off+length])
	return nil
}

func (m *memDisk) Size() int64 { return int64(len(m.data)) }

func (m *memDisk) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

func (m *memDisk) bytes(off, n int) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]byte(nil), m.data[off:off+n]...)
}

func fill(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

// TestErrByOpAndOffset: an error rule fails only the operations of its
// kind that overlap its range; a sync matches any range.
func TestErrByOpAndOffset(t *testing.T) {
	d := NewDisk(newMemDisk(64 << 10))
	d.Add(On(Write, Sync).Range(8192, 4096).Err(syscall.EIO))
	for _, c := range []struct {
		name string
		off  int64
		fail bool
	}{
		{"write before the range", 0, false},
		{"write ending at the range's start", 4096, false},
		{"write inside the range", 8192, true},
		{"write overlapping the range's end", 10240, true},
		{"write starting at the range's end", 12288, false},
	} {
		_, err := d.WriteAt(fill(1, 4096), c.off)
		if fail := errors.Is(err, syscall.EIO); fail != c.fail {
			t.Errorf("%s: %v, want failing %v", c.name, err, c.fail)
		}
	}
	if _, err := d.ReadAt(make([]byte, 4096), 8192); err != nil {
		t.Errorf("a read in the range of a write rule failed: %v", err)
	}
	if err := d.Sync(); !errors.Is(err, syscall.EIO) {
		t.Errorf("sync = %v, want EIO", err)
	}
	if ops, n := d.Count(Write); ops != 5 || n != 5*4096 {
		t.Errorf("counted %d writes of %d bytes, want 5 of %d", ops, n, 5*4096)
	}
	if got := d.Injected(); got != 3 {
		t.Errorf("Injected = %d, want 3", got)
	}
}

// TestRulesComeAndGo: rules added while the disk runs act at once, the
// first added decides, and a removed rule acts no more.
func TestRulesComeAndGo(t *testing.T) {
	d := NewDisk(newMemDisk(8192))
	buf := make([]byte, 512)
	first := errors.New("first")
	removeFirst := d.Add(On(Read).Err(first))
	d.Add(On().Err(ErrInjected))
	if _, err := d.ReadAt(buf, 0); err != first {
		t.Errorf("read = %v, want the first rule's error", err)
	}
	removeFirst()
	if _, err := d.ReadAt(buf, 0); err != ErrInjected {
		t.Errorf("read = %v, want the second rule's error", err)
	}
	d.SetInjector(nil)
	if _, err := d.ReadAt(buf, 0); err != nil {
		t.Errorf("read with no rules = %v", err)
	}
}

// TestTimesAfterAndIf: a rule lets After operations through, then fires
// Times times, on the operations If accepts.
func TestTimesAfterAndIf(t *testing.T) {
	d := NewDisk(newMemDisk(1 << 20))
	r := On(Write).If(func(op Op) bool { return op.Off%8192 == 0 }).After(2).Times(3).Err(ErrInjected)
	d.Add(r)
	var failed []int64
	for i := range 20 {
		off := int64(i) * 4096
		if _, err := d.WriteAt(fill(1, 4096), off); err != nil {
			failed = append(failed, off)
		}
	}
	want := []int64{2 * 8192, 3 * 8192, 4 * 8192}
	if !slices.Equal(failed, want) {
		t.Errorf("failed at %v, want %v", failed, want)
	}
	if r.Hits() != 3 {
		t.Errorf("Hits = %d, want 3", r.Hits())
	}
}

// TestProbAndTornAreDeterministic: two rules with one seed fire on the
// same operations and tear at the same sectors; another seed differs.
func TestProbAndTornAreDeterministic(t *testing.T) {
	run := func(seed uint64) (fired []int, tears []int) {
		r := On(Write).Prob(0.3).Torn().Seed(seed)
		for i := range 200 {
			if f := r.Inject(Op{Kind: Write, Off: 0, Len: 8192}); !f.IsZero() {
				fired = append(fired, i)
				tears = append(tears, f.Tear)
			}
		}
		return fired, tears
	}
	f1, t1 := run(42)
	f2, t2 := run(42)
	f3, _ := run(43)
	if len(f1) < 30 || len(f1) > 90 {
		t.Errorf("Prob(0.3) fired %d times in 200", len(f1))
	}
	if !slices.Equal(f1, f2) || !slices.Equal(t1, t2) {
		t.Error("one seed gave two different runs")
	}
	if slices.Equal(f1, f3) {
		t.Error("two seeds gave the same run")
	}
	for _, tear := range t1 {
		if tear < 1 || tear >= 16 {
			t.Fatalf("a torn 16-sector write kept %d sectors", tear)
		}
	}
}

// TestDroppedAndTornWrites: a dropped write reports success and changes
// nothing; a torn one lands a sector prefix and reports success, or its
// error with the bytes that landed.
func TestDroppedAndTornWrites(t *testing.T) {
	m := newMemDisk(16384)
	d := NewDisk(m)
	remove := d.Add(On(Write).Drop().Times(1))
	if n, err := d.WriteAt(fill(1, 4096), 0); n != 4096 || err != nil {
		t.Fatalf("dropped write = %d, %v; want it acknowledged", n, err)
	}
	if !bytes.Equal(m.bytes(0, 4096), make([]byte, 4096)) {
		t.Fatal("a dropped write changed the disk")
	}
	remove()
	d.Add(On(Write).TornAt(2).Times(1))
	if n, err := d.WriteAt(fill(2, 4096), 0); n != 4096 || err != nil {
		t.Fatalf("torn write = %d, %v; want it acknowledged", n, err)
	}
	if got := m.bytes(0, 4096); !bytes.Equal(got[:1024], fill(2, 1024)) || !bytes.Equal(got[1024:], make([]byte, 3072)) {
		t.Fatal("a write torn at 2 sectors did not land exactly 1024 bytes")
	}
	d.SetInjector(On(Write).TornAt(1).Err(syscall.EIO))
	if n, err := d.WriteAt(fill(3, 4096), 4096); n != 512 || !errors.Is(err, syscall.EIO) {
		t.Fatalf("torn failing write = %d, %v; want 512, EIO", n, err)
	}
	if got := m.bytes(4096, 1024); !bytes.Equal(got[:512], fill(3, 512)) || got[512] != 0 {
		t.Fatal("a torn failing write did not land one sector")
	}
}

// TestLostWritesGoOnPowerLoss: writes a Lose rule keeps in the volatile
// cache are read back, survive a Sync, and a power loss before the Sync
// takes them away; a FUA write is durable at once.
func TestLostWritesGoOnPowerLoss(t *testing.T) {
	m := newMemDisk(1 << 20)
	d := NewDisk(m)
	d.Add(On(Write, Zero).Lose())
	d.WriteAt(fill(1, 4096), 0)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	d.WriteAt(fill(2, 4096), 0)
	d.Zero(8192, 4096)
	d.WriteAt(fill(3, 4096), 16384)
	if err := d.WriteAtSync(fill(4, 4096), 16384); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	d.ReadAt(got, 0)
	if !bytes.Equal(got, fill(2, 4096)) {
		t.Fatal("reads do not see an unsynced write")
	}
	if n := d.Unsynced(); n != 16 {
		t.Fatalf("%d sectors unsynced, want 16 (the write and the zero; the FUA write is durable)", n)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := d.LoseUnsynced(m); n != 16 || err != nil {
		t.Fatalf("power loss took back %d sectors (%v), want 16", n, err)
	}
	if !bytes.Equal(m.bytes(0, 4096), fill(1, 4096)) {
		t.Fatal("a power loss kept an unsynced write")
	}
	if !bytes.Equal(m.bytes(16384, 4096), fill(4, 4096)) {
		t.Fatal("a power loss took away a FUA write")
	}
	if n, _ := d.LoseUnsynced(m); n != 0 {
		t.Fatal("a second power loss took more back")
	}
}

// TestAPowerLossCanTearUnsyncedWrites: a power loss that takes back only
// the sectors it is told to leaves an unsynced write torn at a sector
// boundary, keeps the others of it, and asks about each sector once, in
// order; a FUA write and what a Sync made durable stay whatever it says.
func TestAPowerLossCanTearUnsyncedWrites(t *testing.T) {
	m := newMemDisk(1 << 20)
	d := NewDisk(m)
	d.Add(On(Write).Lose())
	d.WriteAt(fill(1, 8192), 0)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	d.WriteAt(fill(2, 4096), 0)
	d.WriteAt(fill(3, 4096), 4096)
	if err := d.WriteAtSync(fill(4, 4096), 65536); err != nil {
		t.Fatal(err)
	}
	var asked []int64
	n, err := d.LoseUnsyncedTorn(m, func(sector int64) bool {
		asked = append(asked, sector)
		// The first write loses its last 3 sectors; the second keeps all.
		return sector >= 5 && sector < 8
	})
	if err != nil || n != 3 {
		t.Fatalf("power loss took back %d sectors (%v), want 3", n, err)
	}
	if want := []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}; !slices.Equal(asked, want) {
		t.Fatalf("asked about sectors %v, want %v", asked, want)
	}
	if got, want := m.bytes(0, 4096), append(fill(2, 5*SectorSize), fill(1, 3*SectorSize)...); !bytes.Equal(got, want) {
		t.Fatal("the first write is not torn after its fifth sector")
	}
	if !bytes.Equal(m.bytes(4096, 4096), fill(3, 4096)) {
		t.Fatal("the second write, kept by the cache, went back")
	}
	if !bytes.Equal(m.bytes(65536, 4096), fill(4, 4096)) {
		t.Fatal("a power loss took away a FUA write")
	}
	if n, _ := d.LoseUnsyncedTorn(m, nil); n != 0 {
		t.Fatal("a second power loss took more back")
	}
}

// TestDelayHangAndHold runs on the fake clock: a delay takes its time, a
// hung operation waits for Release or Close, a held one for its gate,
// and says so on Entered.
func TestDelayHangAndHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := NewDisk(newMemDisk(8192))
		remove := d.Add(On(Sync).Delay(time.Second))
		start := time.Now()
		d.Sync()
		if took := time.Since(start); took != time.Second {
			t.Errorf("delayed sync took %s", took)
		}
		remove()

		remove = d.Add(On(Zero).Hang())
		done := make(chan error)
		go func() { done <- d.Zero(0, 512) }()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("a hung zero returned before Release")
		default:
		}
		d.Release()
		if err := <-done; err != nil {
			t.Errorf("released zero = %v", err)
		}
		remove()

		g := NewGate()
		d.Add(On(Read).Hold(g))
		go func() {
			_, err := d.ReadAt(make([]byte, 512), 512)
			done <- err
		}()
		if op := <-g.Entered; op.Kind != Read || op.Off != 512 {
			t.Errorf("entered %+v", op)
		}
		g.Open()
		if err := <-done; err != nil {
			t.Errorf("read after Open = %v", err)
		}
		g.Shut()
		go func() {
			_, err := d.ReadAt(make([]byte, 512), 0)
			done <- err
		}()
		<-g.Entered
		d.Close()
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Errorf("held read after Close = %v, want ErrClosed", err)
		}
	})
}

// TestHoldEndsWithContext: a held operation returns when its context ends.
func TestHoldEndsWithContext(t *testing.T) {
	var p Point
	g := NewGate()
	p.Add(On().Hold(g))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := p.Before(ctx, Write, 0, 1, false)
		done <- err
	}()
	<-g.Entered
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("held op after cancel = %v", err)
	}
}

// TestConcurrentUse: operations, rule changes and counters race, under
// -race, and every operation is counted.
func TestConcurrentUse(t *testing.T) {
	d := NewDisk(newMemDisk(1 << 20))
	r := On(Write).Prob(0.5).Seed(1).Err(ErrInjected)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := range 200 {
				off := int64((w*200+i)%256) * 4096
				d.WriteAt(buf, off)
				d.ReadAt(buf, off)
				if i%50 == 0 {
					remove := d.Add(On(Read).Range(off, 4096).Delay(time.Microsecond))
					remove()
				}
			}
		}()
	}
	d.Add(r)
	wg.Wait()
	if ops, _ := d.Count(Write); ops != 1600 {
		t.Errorf("counted %d writes, want 1600", ops)
	}
	if r.Hits() == 0 {
		t.Error("the rule never fired")
	}
}
