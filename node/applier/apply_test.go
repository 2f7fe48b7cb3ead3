package applier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
)

// These tests pin the order in which a batch reaches the disk and the
// volume: the replica indicator and the activity log BEFORE a write, the
// activity log's Done after it, a FUA discard durable BEFORE the ack, the
// resynced data durable BEFORE the volume records the resync's end, and a
// failed entry reported to the volume and to the primary, with nothing
// after it applied.

// trace records, in order, what the applier asked of the disk, the
// activity log and the volume.
type trace struct {
	mu  sync.Mutex
	ops []string
}

func (t *trace) add(format string, a ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ops = append(t.ops, fmt.Sprintf(format, a...))
}

func (t *trace) list() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.ops)
}

type memDisk struct {
	t        *trace
	data     []byte
	failFrom int64 // a write at or past this offset fails (0: none)
	// findsHoles: IsHole tells a range of zeroes (a sparse file's hole).
	findsHoles bool
}

func (d *memDisk) ReadAt(p []byte, off int64) (int, error) {
	d.t.add("read %d+%d", off, len(p))
	return copy(p, d.data[off:]), nil
}

func (d *memDisk) WriteAt(p []byte, off int64) (int, error) {
	if d.failFrom != 0 && off >= d.failFrom {
		d.t.add("write %d+%d failed", off, len(p))
		return 0, io.ErrShortWrite
	}
	d.t.add("write %d+%d", off, len(p))
	return copy(d.data[off:], p), nil
}

func (d *memDisk) WriteSync(p []byte, off int64) error {
	d.t.add("write-sync %d+%d", off, len(p))
	copy(d.data[off:], p)
	return nil
}

func (d *memDisk) Zero(off, length int64) error {
	d.t.add("zero %d+%d", off, length)
	clear(d.data[off : off+length])
	return nil
}

func (d *memDisk) Sync() error { d.t.add("sync"); return nil }
func (d *memDisk) IsHole(off, length int64) bool {
	return d.findsHoles && !slices.ContainsFunc(d.data[off:off+length], func(b byte) bool { return b != 0 })
}

type traceLog struct{ t *trace }

func (l traceLog) Admit(_ context.Context, off, length int64) error {
	l.t.add("admit %d+%d", off, length)
	return nil
}
func (l traceLog) Done(off, length int64) { l.t.add("done %d+%d", off, length) }

type traceState struct{ t *trace }

func (s traceState) MarkReplica() error { s.t.add("mark-replica"); return nil }
func (s traceState) SyncStarted(from replication.Generation) error {
	s.t.add("sync-started %x", from[:1])
	return nil
}
func (s traceState) SyncFinished(primary string, g replication.Generation, history []replication.Generation) error {
	s.t.add("sync-finished %s %x %d", primary, g[:1], len(history))
	return nil
}
func (s traceState) Failed(err error) { s.t.add("failed: %v", err) }

func newVolume(size int64) (*Volume, *memDisk, *trace) {
	t := &trace{}
	d := &memDisk{t: t, data: make([]byte, size)}
	v := &Volume{
		Name: "vol1", Self: "beta", Disk: d, ActivityLog: traceLog{t},
		Size: new(atomic.Int64), Resynced: new(atomic.Int64),
		Buffers: &sync.Pool{New: func() any { b := make([]byte, 4096); return &b }},
		Log:     slog.New(slog.DiscardHandler), State: traceState{t},
	}
	v.Size.Store(size)
	return v, d, t
}

func noReads(seq uint64, st replication.AckStatus, data []byte) error {
	return errors.New("no read expected")
}

func TestApplyWritesAfterTheActivityLogAndAFUADiscardBeforeTheAck(t *testing.T) {
	v, d, tr := newVolume(64 << 10)
	in := NewStream("alpha")
	ack := in.apply(v, []replication.Entry{
		{Op: replication.OpWrite, Seq: 1, Off: 0, Length: 4096, Data: bytes.Repeat([]byte{1}, 4096)},
		{Op: replication.OpWrite, Seq: 2, Off: 4096, Length: 4096, Flags: replication.EntryFUA, Data: bytes.Repeat([]byte{2}, 4096)},
		{Op: replication.OpTrim, Seq: 3, Off: 0, Length: 4096, Flags: replication.EntryFUA},
		{Op: replication.OpFlush, Seq: 4},
	}, noReads)
	if ack != (replication.Ack{Seq: 4}) {
		t.Fatalf("ack %+v, want seq 4 OK", ack)
	}
	want := []string{
		"mark-replica", "admit 0+4096", "write 0+4096", "done 0+4096",
		"mark-replica", "admit 4096+4096", "write-sync 4096+4096", "done 4096+4096",
		"mark-replica", "admit 0+4096", "zero 0+4096", "done 0+4096",
		"sync",
		"sync", // the FUA discard, BEFORE the ack
	}
	if got := tr.list(); !slices.Equal(got, want) {
		t.Errorf("applied\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if d.data[0] != 0 || d.data[4096] != 2 {
		t.Errorf("disk holds %d at 0 and %d at 4096, want 0 and 2", d.data[0], d.data[4096])
	}
}

func TestApplyAFailedWriteStopsTheBatchAndTellsTheVolume(t *testing.T) {
	v, d, tr := newVolume(64 << 10)
	d.failFrom = 8192
	ack := NewStream("alpha").apply(v, []replication.Entry{
		{Op: replication.OpWrite, Seq: 1, Off: 8192, Length: 4096, Data: make([]byte, 4096)},
		{Op: replication.OpWrite, Seq: 2, Off: 0, Length: 4096, Data: make([]byte, 4096)},
	}, noReads)
	if ack.Seq != 2 || ack.Status != replication.AckIOError || !strings.HasPrefix(ack.Message, "beta: ") {
		t.Fatalf("ack %+v, want seq 2 (the batch's) with an IO error from beta", ack)
	}
	got := tr.list()
	if !slices.Contains(got, "failed: "+io.ErrShortWrite.Error()) {
		t.Errorf("the volume was not told: %q", got)
	}
	if slices.Contains(got, "write 0+4096") {
		t.Errorf("an entry after the failed one was applied: %q", got)
	}
}

func TestApplyAnEntryBeyondTheVolumeEndFails(t *testing.T) {
	v, _, tr := newVolume(64 << 10)
	ack := NewStream("alpha").apply(v, []replication.Entry{
		{Op: replication.OpWrite, Seq: 1, Off: 64 << 10, Length: 4096, Data: make([]byte, 4096)},
	}, noReads)
	if ack.Status != replication.AckIOError {
		t.Fatalf("ack %+v, want an IO error", ack)
	}
	if got := tr.list(); len(got) != 1 || !strings.HasPrefix(got[0], "failed: entry beyond the volume end") {
		t.Errorf("applied %q, want only the volume told", got)
	}
}

func TestApplyAResyncIsDurableBeforeTheVolumeRecordsItsEnd(t *testing.T) {
	v, _, tr := newVolume(64 << 10)
	in := NewStream("alpha")
	in.SetState(replication.Connected)
	g := replication.Generation{0xaa}
	ack := in.apply(v, []replication.Entry{{Op: replication.OpSyncStart, Seq: 1, Data: g[:]}}, noReads)
	if ack.Status != replication.AckOK || in.State() != replication.SyncTarget {
		t.Fatalf("after the sync start: ack %+v, stream %s; want OK and SyncTarget", ack, in.State())
	}
	h := replication.Generation{0xbb}
	ack = in.apply(v, []replication.Entry{
		{Op: replication.OpResyncData, Seq: 2, Off: 0, Length: 4096, Data: make([]byte, 4096)},
		{Op: replication.OpResyncZero, Seq: 3, Off: 4096, Length: 8192},
		{Op: replication.OpSyncDone, Seq: 4, Data: append(g[:], h[:]...)},
	}, noReads)
	if ack != (replication.Ack{Seq: 4}) || in.State() != replication.Connected {
		t.Fatalf("after the sync end: ack %+v, stream %s; want seq 4 OK and Connected", ack, in.State())
	}
	want := []string{"sync-started aa",
		"mark-replica", "admit 0+4096", "write 0+4096", "done 0+4096",
		"mark-replica", "admit 4096+8192", "zero 4096+8192", "done 4096+8192",
		"sync", "sync-finished alpha aa 1"}
	if got := tr.list(); !slices.Equal(got, want) {
		t.Errorf("applied %q, want %q", got, want)
	}
	if got := v.Resynced.Load(); got != 12288 {
		t.Errorf("resynced %d bytes, want 12288", got)
	}
}

func TestApplyAReadIsAnsweredBeforeTheAck(t *testing.T) {
	v, d, _ := newVolume(64 << 10)
	copy(d.data[4096:], "hello")
	var replies []string
	ack := NewStream("alpha").apply(v, []replication.Entry{
		{Op: replication.OpRead, Seq: 7, Off: 4096, Length: 5},
	}, func(seq uint64, st replication.AckStatus, data []byte) error {
		replies = append(replies, fmt.Sprintf("%d %d %s", seq, st, data))
		return nil
	})
	if ack != (replication.Ack{Seq: 7}) {
		t.Fatalf("ack %+v, want seq 7 OK", ack)
	}
	if want := []string{fmt.Sprintf("7 %d hello", replication.AckOK)}; !slices.Equal(replies, want) {
		t.Errorf("replies %q, want %q", replies, want)
	}
}

// TestApplyResyncDataGoesThroughTheActivityLog: a resync target writes
// what it is sent as it writes a primary's writes, the replica indicator
// and the activity log's extents on stable storage BEFORE the data, Done
// after it: a later change of primary marks those extents toward the
// third nodes, which may never have had them (issue 28's
// resync-not-in-activity-log), and a crash of this node resyncs them
// again. A zero range over a hole changes nothing and logs nothing.
func TestApplyResyncDataGoesThroughTheActivityLog(t *testing.T) {
	const extent = 4 << 20
	v, d, tr := newVolume(3 * extent)
	d.findsHoles = true
	d.data[2*extent] = 9 // the third extent holds data; the second is a hole
	in := NewStream("alpha")
	in.SetState(replication.SyncTarget)
	ack := in.apply(v, []replication.Entry{
		{Op: replication.OpResyncData, Seq: 1, Off: extent - 4096, Length: 8192, Data: bytes.Repeat([]byte{7}, 8192)},
		{Op: replication.OpResyncZero, Seq: 2, Off: extent + 4096, Length: 4096},
		{Op: replication.OpResyncZero, Seq: 3, Off: 2 * extent, Length: 4096},
	}, noReads)
	if ack != (replication.Ack{Seq: 3}) {
		t.Fatalf("ack %+v, want seq 3 OK", ack)
	}
	want := []string{
		"mark-replica", fmt.Sprintf("admit %d+8192", extent-4096), fmt.Sprintf("write %d+8192", extent-4096), fmt.Sprintf("done %d+8192", extent-4096),
		"mark-replica", fmt.Sprintf("admit %d+4096", 2*extent), fmt.Sprintf("zero %d+4096", 2*extent), fmt.Sprintf("done %d+4096", 2*extent),
	}
	if got := tr.list(); !slices.Equal(got, want) {
		t.Errorf("applied\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if d.data[extent] != 7 || d.data[2*extent] != 0 {
		t.Errorf("disk holds %d at %d and %d at %d, want 7 and 0", d.data[extent], extent, d.data[2*extent], 2*extent)
	}
	if got := v.Resynced.Load(); got != 16384 {
		t.Errorf("resynced %d bytes, want 16384", got)
	}
}

// failingLog is an activity log whose transactions fail.
type failingLog struct{ t *trace }

func (l failingLog) Admit(_ context.Context, off, length int64) error {
	l.t.add("admit %d+%d failed", off, length)
	return errors.New("metadata device gone")
}
func (l failingLog) Done(off, length int64) { l.t.add("done %d+%d", off, length) }

// TestApplyResyncDataIsNotWrittenWhenItsActivityLogFails: the log's
// extents are durable BEFORE the data is written, so when the log fails
// the data is not written, and the volume and the source are told.
func TestApplyResyncDataIsNotWrittenWhenItsActivityLogFails(t *testing.T) {
	v, d, tr := newVolume(64 << 10)
	v.ActivityLog = failingLog{tr}
	ack := NewStream("alpha").apply(v, []replication.Entry{
		{Op: replication.OpResyncData, Seq: 1, Off: 0, Length: 4096, Data: bytes.Repeat([]byte{7}, 4096)},
	}, noReads)
	if ack.Status != replication.AckIOError {
		t.Fatalf("ack %+v, want an IO error", ack)
	}
	got := tr.list()
	if slices.ContainsFunc(got, func(op string) bool { return strings.HasPrefix(op, "write") || strings.HasPrefix(op, "done") }) {
		t.Errorf("the data was written (or Done without Admit) though the log failed: %q", got)
	}
	if !slices.ContainsFunc(got, func(op string) bool { return strings.HasPrefix(op, "failed: activity log") }) {
		t.Errorf("the volume was not told: %q", got)
	}
	if d.data[0] != 0 || v.Resynced.Load() != 0 {
		t.Errorf("disk holds %d at 0, resynced %d bytes; want 0 and 0", d.data[0], v.Resynced.Load())
	}
}

// TestANewStreamHoldsOffTheOneItReplaces: what holds a stream that
// replaced another (a scrub's Exclusive) waits for the old one's batch
// in progress and stops it first: no batch of the old stream runs beside
// it, and the old one applies nothing after.
func TestANewStreamHoldsOffTheOneItReplaces(t *testing.T) {
	old := NewStream("alpha")
	inBatch, release := make(chan struct{}), make(chan struct{})
	go old.Exclusive(func() { // the old stream's batch in progress
		close(inBatch)
		<-release
	})
	<-inBatch
	next := NewStreamAfter("alpha", old)
	held := make(chan struct{})
	go func() {
		next.Exclusive(func() {})
		close(held)
	}()
	select {
	case <-held:
		t.Fatal("the new stream was held while a batch of the one it replaces was still applied")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	<-held
	if old.Exclusive(func() {}) {
		t.Fatal("the replaced stream still runs what holds it after the new one was held: it was not stopped")
	}
	if !next.Exclusive(func() {}) {
		t.Fatal("the new stream no longer runs what holds it")
	}
}
