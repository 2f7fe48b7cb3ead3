package main

// Helpers for the asynchronous-replication tests (issue 10,
// async_e2e_test.go): the lag and congestion fields of status, a throttled
// link (tc tbf on a node's eth0 in the network lab), a forced promotion
// after a crash, fio's figures, and a batch writer whose records say
// which batch and which place in it they belong to, each batch followed
// by a FLUSH, so that what a replica holds can be checked to be a prefix
// of the flushed history.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// status

// asyncStatus asks node (through the cluster's own replctl runner, inside
// the network lab when there is one) for the cluster status and returns
// vol0's entry.
func (c *procCluster) asyncStatus(node string) (*volumeStatus, error) {
	r := c.ctl(node, "status", "--json")
	if !r.ok() {
		return nil, fmt.Errorf("replctl status --json via %s: %s", node, r)
	}
	var doc statusDoc
	js := r.out
	if i := strings.IndexByte(js, '{'); i > 0 {
		js = js[i:]
	}
	if err := json.Unmarshal([]byte(js), &doc); err != nil {
		return nil, fmt.Errorf("replctl status --json via %s: %v in %q", node, err, r.out)
	}
	for i := range doc.Volumes {
		if doc.Volumes[i].Name == volName {
			return &doc.Volumes[i], nil
		}
	}
	return nil, fmt.Errorf("replctl status --json via %s: no volume %s", node, volName)
}

// ---------------------------------------------------------------------------
// a slow link

// throttle limits what node sends on its eth0 to rate (tc's syntax, such
// as 8mbit) with a token bucket; the node's own clients, in its
// namespace, reach it over lo and are not slowed. Network lab only; the
// lab's removal takes the qdisc with the namespace.
func (c *procCluster) throttle(node, rate string) {
	c.t.Helper()
	c.needLab("throttle")
	tc := RequireTool(c.t, "tc", "iproute2")
	r := c.lab.run(node, 10*time.Second, tc, "qdisc", "replace", "dev", "eth0", "root", "tbf",
		"rate", rate, "burst", "32kbit", "latency", "400ms")
	if !r.ok() {
		c.t.Fatalf("throttle %s's eth0 to %s: tc: %s", node, rate, r)
	}
}

// unthrottle removes node's token bucket, if any.
func (c *procCluster) unthrottle(node string) {
	c.t.Helper()
	c.needLab("unthrottle")
	tc := RequireTool(c.t, "tc", "iproute2")
	show := c.lab.run(node, 10*time.Second, tc, "qdisc", "show", "dev", "eth0")
	if !show.ok() {
		c.t.Fatalf("tc qdisc show in %s: %s", node, show)
	}
	if !strings.Contains(show.out, "tbf") {
		return
	}
	if r := c.lab.run(node, 10*time.Second, tc, "qdisc", "del", "dev", "eth0", "root"); !r.ok() {
		c.t.Fatalf("unthrottle %s's eth0: tc: %s", node, r)
	}
}

// ---------------------------------------------------------------------------
// promotion after a crash

// forcePrimary runs `replctl primary vol0 --node N --force --yes`, again
// until it is accepted (for at most 20 s), and returns how long that took.
// The caller proves the promotion by using N's export (dialExport).
func (c *procCluster) forcePrimary(node string) time.Duration {
	c.t.Helper()
	began := time.Now()
	var r result
	if !within(20*time.Second, 200*time.Millisecond, func() bool {
		r = c.ctl(node, "primary", volName, "--node", node, "--force", "--yes")
		if !r.ok() {
			c.t.Logf("replctl primary --force on %s not accepted yet: %s", node, r)
		}
		return r.ok()
	}) {
		c.t.Fatalf("replctl primary %s --node %s --force --yes: %s", volName, node, r)
	}
	return time.Since(began)
}

// dialExport connects to node's export through dial (nil: the host's
// network), retrying until it accepts the handshake (an export opens a
// moment after the promotion) or timeout.
func (c *procCluster) dialExport(dial dialFunc, node string, timeout time.Duration) *rawNBD {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var conn *rawNBD
	var err error
	if !within(timeout, 50*time.Millisecond, func() bool {
		conn, err = dialRawNBDVia(ctx, dial, c.uri(node), 2*time.Second, 10*time.Second)
		return err == nil || ctx.Err() != nil
	}) || err != nil {
		c.t.Fatalf("%s's export: %v", node, err)
	}
	return conn
}

// flush sends NBD_CMD_FLUSH and returns the server's errno.
func (c *rawNBD) flush() (uint32, error) {
	errno, _, err := c.request(nbdCmdFlush, 0, 0, 0, nil, 0)
	return errno, err
}

// ---------------------------------------------------------------------------
// numbered records in flushed batches

// A record is one 4 KiB block: magic, the run's nonce, batch, index in
// the batch and offset, a filler derived from them, and a CRC32-C of all
// that in the last 4 bytes.
const recordMagic = "rvBATCH\x00"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func recordBlock(nonce, batch, index, off uint64) []byte {
	b := make([]byte, blockSize)
	copy(b, recordMagic)
	binary.LittleEndian.PutUint64(b[8:], nonce)
	binary.LittleEndian.PutUint64(b[16:], batch)
	binary.LittleEndian.PutUint64(b[24:], index)
	binary.LittleEndian.PutUint64(b[32:], off)
	fill := (nonce ^ batch<<24 ^ index) * 0x9e3779b97f4a7c15
	for i := 40; i+8 <= blockSize-4; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], fill+uint64(i))
	}
	binary.LittleEndian.PutUint32(b[blockSize-4:], crc32.Checksum(b[:blockSize-4], castagnoli))
	return b
}

// batchLayout places batch k's record i at Base + (k×PerBatch + i) × 4 KiB,
// for Batches batches.
type batchLayout struct {
	Base              uint64
	PerBatch, Batches int
}

func (l batchLayout) offset(batch, index int) uint64 {
	return l.Base + uint64(batch*l.PerBatch+index)*blockSize
}

// batchWriter writes batches in order on one NBD connection: the
// records of batch k one by one, then a FLUSH, then batch k+1, until the
// layout is full or a request fails (the primary died).
type batchWriter struct {
	layout batchLayout
	nonce  uint64
	// started is the last batch whose first record was sent, flushed the
	// last whose FLUSH was acknowledged (-1: none).
	started, flushed atomic.Int64
	done             chan struct{}
	err              error // why it stopped; read after done
}

func startBatchWriter(conn *rawNBD, layout batchLayout, nonce uint64) *batchWriter {
	w := &batchWriter{layout: layout, nonce: nonce, done: make(chan struct{})}
	w.started.Store(-1)
	w.flushed.Store(-1)
	go func() {
		defer close(w.done)
		defer conn.conn.Close()
		w.err = w.run(conn)
	}()
	return w
}

func (w *batchWriter) run(conn *rawNBD) error {
	for k := range w.layout.Batches {
		w.started.Store(int64(k))
		for i := range w.layout.PerBatch {
			off := w.layout.offset(k, i)
			errno, err := conn.write(off, recordBlock(w.nonce, uint64(k), uint64(i), off))
			if err == nil && errno != 0 {
				err = fmt.Errorf("errno %d", errno)
			}
			if err != nil {
				return fmt.Errorf("batch %d record %d: write: %w", k, i, err)
			}
		}
		errno, err := conn.flush()
		if err == nil && errno != 0 {
			err = fmt.Errorf("errno %d", errno)
		}
		if err != nil {
			return fmt.Errorf("batch %d: flush: %w", k, err)
		}
		w.flushed.Store(int64(k))
	}
	return nil
}

// wait waits for the writer to stop, at most timeout.
func (w *batchWriter) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(timeout):
		t.Fatalf("the batch writer did not stop %s after its primary died", timeout)
	}
}

// batchCheck is what a replica holds of one run of the batch writer.
type batchCheck struct {
	// Complete is the last batch m such that batches 0..m are all whole
	// (-1: not even batch 0); PartialRecords how many records of batch
	// m+1 are there.
	Complete, PartialRecords int
	// Problems lists what breaks the prefix property: a record of a batch
	// after m+1, a damaged record, a record in the wrong place.
	Problems []string
}

// checkBatches reads batches 0..upTo of the layout with read (such as a
// rawNBD's) and checks that they form a prefix of the writer's history.
func checkBatches(read func(off uint64, n int) ([]byte, error), l batchLayout, nonce uint64, upTo int) (batchCheck, error) {
	upTo = min(upTo, l.Batches-1)
	present := make([]int, upTo+1)
	var res batchCheck
	problem := func(format string, args ...any) {
		if len(res.Problems) < 20 {
			res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
		}
	}
	const chunk = 256 // blocks per read
	total := (upTo + 1) * l.PerBatch
	for first := 0; first < total; first += chunk {
		n := min(chunk, total-first)
		data, err := read(l.Base+uint64(first)*blockSize, n*blockSize)
		if err != nil {
			return res, err
		}
		for j := range n {
			slot := first + j
			k, i := slot/l.PerBatch, slot%l.PerBatch
			off := l.offset(k, i)
			b := data[j*blockSize : (j+1)*blockSize]
			if !bytes.HasPrefix(b, []byte(recordMagic)) || binary.LittleEndian.Uint64(b[8:]) != nonce {
				continue // never written in this run
			}
			if crc32.Checksum(b[:blockSize-4], castagnoli) != binary.LittleEndian.Uint32(b[blockSize-4:]) {
				problem("batch %d record %d at %d: damaged (bad checksum)", k, i, off)
				continue
			}
			if !bytes.Equal(b, recordBlock(nonce, uint64(k), uint64(i), off)) {
				problem("batch %d record %d at %d: holds batch %d record %d for offset %d", k, i, off,
					binary.LittleEndian.Uint64(b[16:]), binary.LittleEndian.Uint64(b[24:]), binary.LittleEndian.Uint64(b[32:]))
				continue
			}
			present[k]++
		}
	}
	res.Complete = -1
	for k := 0; k <= upTo && present[k] == l.PerBatch; k++ {
		res.Complete = k
	}
	if next := res.Complete + 1; next <= upTo {
		res.PartialRecords = present[next]
	}
	for k := res.Complete + 2; k <= upTo; k++ {
		if present[k] > 0 {
			problem("batch %d has %d of %d records, but batch %d is incomplete (%d of %d): a later batch without an earlier one",
				k, present[k], l.PerBatch, res.Complete+1, res.PartialRecords, l.PerBatch)
		}
	}
	return res, nil
}

// lastLine is the last non-empty line of a command's output, trimmed
// (the final figure of `replctl verify --wait`).
func lastLine(out string) string {
	out = strings.TrimSpace(out)
	return strings.TrimSpace(out[strings.LastIndexByte(out, '\n')+1:])
}

// ---------------------------------------------------------------------------
// fio

// fioResult is the part of fio's JSON output the tests read (one job).
type fioResult struct {
	Error int
	Write struct {
		IOPS    float64
		IOBytes int64
	}
	Read struct {
		IOBytes int64
	}
}

func parseFio(out string) (fioResult, error) {
	i := strings.IndexByte(out, '{')
	if i < 0 {
		return fioResult{}, fmt.Errorf("no JSON in fio's output: %q", out)
	}
	var doc struct {
		Jobs []struct {
			Error int `json:"error"`
			Write struct {
				IOPS    float64 `json:"iops"`
				IOBytes int64   `json:"io_bytes"`
			} `json:"write"`
			Read struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"read"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out[i:]), &doc); err != nil {
		return fioResult{}, fmt.Errorf("fio's JSON: %v in %q", err, out)
	}
	if len(doc.Jobs) != 1 {
		return fioResult{}, fmt.Errorf("fio's JSON: %d jobs, want 1", len(doc.Jobs))
	}
	j := doc.Jobs[0]
	var r fioResult
	r.Error = j.Error
	r.Write.IOPS, r.Write.IOBytes = j.Write.IOPS, j.Write.IOBytes
	r.Read.IOBytes = j.Read.IOBytes
	return r, nil
}

// TestHarnessBatchPrefixCheck pins checkBatches on volumes held in
// memory: it accepts whole batches followed by part of one, and reports
// a later batch present while an earlier one is not whole, a damaged
// record and a record in another's place.
func TestHarnessBatchPrefixCheck(t *testing.T) {
	const nonce = 77
	l := batchLayout{Base: 8 * blockSize, PerBatch: 4, Batches: 6}
	for _, tc := range []struct {
		name string
		// records lists the records written, as {batch, index}.
		records [][2]int
		// damage flips a byte of the record at this slot (-1: none);
		// swap puts the record of slot swap[0] in slot swap[1].
		damage       int
		swap         [2]int
		wantComplete int
		wantPartial  int
		wantProblem  string
	}{
		{name: "nothing written", damage: -1, wantComplete: -1},
		{name: "two whole batches and half the third",
			records: [][2]int{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}, {1, 2}, {1, 3}, {2, 1}, {2, 3}},
			damage:  -1, wantComplete: 1, wantPartial: 2},
		{name: "a record of batch 2 while batch 1 lacks one",
			records: [][2]int{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}, {1, 2}, {2, 0}},
			damage:  -1, wantComplete: 0, wantPartial: 3, wantProblem: "a later batch without an earlier one"},
		{name: "a damaged record",
			records: [][2]int{{0, 0}, {0, 1}, {0, 2}, {0, 3}},
			damage:  2, wantComplete: -1, wantPartial: 3, wantProblem: "damaged"},
		{name: "a record in another's place",
			records: [][2]int{{0, 0}, {0, 1}, {0, 2}, {0, 3}},
			damage:  -1, swap: [2]int{1, 2}, wantComplete: -1, wantPartial: 3, wantProblem: "holds batch 0 record 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vol := make([]byte, l.offset(l.Batches, 0))
			for _, r := range tc.records {
				off := l.offset(r[0], r[1])
				copy(vol[off:], recordBlock(nonce, uint64(r[0]), uint64(r[1]), off))
			}
			if tc.damage >= 0 {
				vol[l.Base+uint64(tc.damage)*blockSize+100] ^= 0xff
			}
			if tc.swap != [2]int{} {
				from, to := l.Base+uint64(tc.swap[0])*blockSize, l.Base+uint64(tc.swap[1])*blockSize
				copy(vol[to:to+blockSize], vol[from:from+blockSize])
			}
			read := func(off uint64, n int) ([]byte, error) { return vol[off : off+uint64(n)], nil }
			res, err := checkBatches(read, l, nonce, l.Batches-1)
			if err != nil {
				t.Fatal(err)
			}
			if res.Complete != tc.wantComplete || res.PartialRecords != tc.wantPartial {
				t.Errorf("complete %d, partial %d; want %d, %d", res.Complete, res.PartialRecords, tc.wantComplete, tc.wantPartial)
			}
			problems := strings.Join(res.Problems, "; ")
			if (tc.wantProblem == "") != (problems == "") || !strings.Contains(problems, tc.wantProblem) {
				t.Errorf("problems %q, want one saying %q", problems, tc.wantProblem)
			}
		})
	}
}
