package main

// A linearizability check of reads and writes of a few 4 KiB blocks
// (independent registers), with porcupine: an operation recorder that
// client goroutines share, the register model, and checkLinearizable.
//
// A write that did not complete (an error reply, a timeout, a dropped
// connection) may or may not have taken effect, now or at any later time:
// it enters the history with its return at the end of the history. A read
// that did not complete observed nothing and is left out.

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

type opKind uint8

const (
	opRead opKind = iota
	opWrite
)

func (k opKind) String() string {
	if k == opWrite {
		return "write"
	}
	return "read"
}

// opOutcome is how an operation ended.
type opOutcome uint8

const (
	opPending  opOutcome = iota // not finished (yet): like opTimedOut
	opOK                        // acknowledged (a write) or data returned (a read)
	opFailed                    // an error reply: a write may still have happened
	opTimedOut                  // no reply (deadline, dropped connection)
)

func (o opOutcome) String() string {
	return [...]string{"pending", "ok", "failed", "timed out"}[o]
}

// histOp is one recorded operation.
type histOp struct {
	Client int
	Kind   opKind
	Block  int
	// Value is the value written, or the value a successful read returned
	// (0: a block never written; tornValue: no value any write wrote).
	Value   uint64
	Call    time.Duration // since the recorder started
	Return  time.Duration
	Outcome opOutcome
	Node    string // the node whose export served it
	Err     string
}

// opRecorder collects the history of several client goroutines.
type opRecorder struct {
	start   time.Time
	clients atomic.Int64
	seq     atomic.Uint64

	mu  sync.Mutex
	ops []histOp
}

func newOpRecorder() *opRecorder { return &opRecorder{start: time.Now()} }

// newClient returns a fresh client id. A client whose operation ended
// unknown should continue as a new client (as Jepsen does), so that the
// visualization shows its later operations on their own line.
func (r *opRecorder) newClient() int { return int(r.clients.Add(1) - 1) }

// nextValue returns a value no other write of block wrote: the block
// number in the top 16 bits, a sequence number below.
func (r *opRecorder) nextValue(block int) uint64 {
	return uint64(block+1)<<48 | r.seq.Add(1)
}

// begin records the call of an operation (value: the value a write
// writes) and returns its id for finish. Call it just before the request
// goes out.
func (r *opRecorder) begin(client int, kind opKind, block int, value uint64) int {
	now := time.Since(r.start)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, histOp{Client: client, Kind: kind, Block: block, Value: value, Call: now})
	return len(r.ops) - 1
}

// finish records the return of operation id, just after its reply (or
// its failure) arrived. readValue is what a successful read returned.
func (r *opRecorder) finish(id int, outcome opOutcome, readValue uint64, node string, err error) {
	now := time.Since(r.start)
	r.mu.Lock()
	defer r.mu.Unlock()
	op := &r.ops[id]
	op.Return, op.Outcome, op.Node = now, outcome, node
	if op.Kind == opRead && outcome == opOK {
		op.Value = readValue
	}
	if err != nil {
		op.Err = err.Error()
	}
}

// history returns a copy of the operations recorded so far.
func (r *opRecorder) history() []histOp {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]histOp(nil), r.ops...)
}

// waitCompleted polls until n operations served by node ("": any) have
// completed since the recorder started, and fails the test after timeout.
func (r *opRecorder) waitCompleted(t testing.TB, node string, n int, timeout time.Duration) {
	t.Helper()
	got := 0
	if !within(timeout, 20*time.Millisecond, func() bool {
		got = 0
		r.mu.Lock()
		for _, op := range r.ops {
			if op.Outcome == opOK && (node == "" || op.Node == node) {
				got++
			}
		}
		r.mu.Unlock()
		return got >= n
	}) {
		t.Fatalf("only %d of %d operations completed on %q after %s (%s)", got, n, node, timeout, historySummary(r.history()))
	}
}

// historySummary counts operations by kind and outcome, for the log.
func historySummary(h []histOp) string {
	var n [2][4]int
	for _, op := range h {
		n[op.Kind][op.Outcome]++
	}
	return fmt.Sprintf("%d ops: writes %d ok, %d failed, %d timed out, %d pending; reads %d ok, %d failed, %d timed out",
		len(h), n[opWrite][opOK], n[opWrite][opFailed], n[opWrite][opTimedOut], n[opWrite][opPending],
		n[opRead][opOK], n[opRead][opFailed], n[opRead][opTimedOut]+n[opRead][opPending])
}

// ---------------------------------------------------------------------------
// block contents

// blockSize is the size of one register.
const blockSize = 4096

// tornValue is what decodeBlock returns for a block no single write wrote
// (torn, misdirected or foreign data). No write writes it.
const tornValue = ^uint64(0)

// encodeBlock fills a block with value, 512 times.
func encodeBlock(value uint64) []byte {
	b := make([]byte, blockSize)
	for i := 0; i < blockSize; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], value)
	}
	return b
}

// decodeBlock returns the value a block holds: 0 for zeroes, tornValue
// when its words differ or name another block.
func decodeBlock(block int, b []byte) uint64 {
	if len(b) != blockSize {
		return tornValue
	}
	v := binary.LittleEndian.Uint64(b)
	for i := 8; i < blockSize; i += 8 {
		if binary.LittleEndian.Uint64(b[i:]) != v {
			return tornValue
		}
	}
	if v != 0 && v>>48 != uint64(block+1) {
		return tornValue
	}
	return v
}

// ---------------------------------------------------------------------------
// the model

type regInput struct {
	Write bool
	Block int
	Value uint64 // written
}

type regOutput struct {
	Value uint64 // read
}

// registerModel is one register per block (zero at first): a read returns
// the last value written. Histories are partitioned by block.
var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byBlock := map[int][]porcupine.Operation{}
		var order []int
		for _, op := range history {
			b := op.Input.(regInput).Block
			if _, ok := byBlock[b]; !ok {
				order = append(order, b)
			}
			byBlock[b] = append(byBlock[b], op)
		}
		parts := make([][]porcupine.Operation, 0, len(order))
		for _, b := range order {
			parts = append(parts, byBlock[b])
		}
		return parts
	},
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regInput)
		if in.Write {
			return true, in.Value
		}
		return output.(regOutput).Value == state.(uint64), state
	},
	Hash: func(state any) uint64 { return state.(uint64) },
	DescribeOperation: func(input, output any) string {
		in := input.(regInput)
		if in.Write {
			return fmt.Sprintf("write(b%d, %s)", in.Block, describeValue(in.Value))
		}
		return fmt.Sprintf("read(b%d) → %s", in.Block, describeValue(output.(regOutput).Value))
	},
	DescribeState: func(state any) string { return describeValue(state.(uint64)) },
	DescribeOperationMetadata: func(info any) string {
		if s, ok := info.(string); ok {
			return s
		}
		return ""
	},
}

func describeValue(v uint64) string {
	switch v {
	case 0:
		return "zero"
	case tornValue:
		return "torn"
	}
	return fmt.Sprintf("#%d", v&(1<<48-1))
}

// porcupineHistory turns a recorded history into porcupine operations.
// A write that did not complete returns at the end of the history (it may
// take effect any time after its call, or never); a read that did not
// complete is left out.
func porcupineHistory(h []histOp) []porcupine.Operation {
	var end time.Duration
	for _, op := range h {
		end = max(end, op.Call, op.Return)
	}
	end++
	ops := make([]porcupine.Operation, 0, len(h))
	for _, op := range h {
		ret := op.Return
		meta := op.Outcome.String()
		if op.Node != "" {
			meta += " on " + op.Node
		}
		if op.Err != "" {
			meta += ": " + op.Err
		}
		if op.Outcome != opOK {
			if op.Kind == opRead {
				continue
			}
			ret = end
		}
		ops = append(ops, porcupine.Operation{
			ClientId: op.Client,
			Input:    regInput{Write: op.Kind == opWrite, Block: op.Block, Value: op.Value},
			Call:     int64(op.Call),
			Output:   regOutput{Value: op.Value},
			Return:   int64(ret),
			Metadata: meta,
		})
	}
	return ops
}

// linearizabilityTimeout bounds a check in CI.
const linearizabilityTimeout = 10 * time.Second

// checkLinearizable checks a history against registerModel within
// timeout. Not linearizable: the test fails, naming an HTML visualization
// of the history (kept after the test, in the temp directory). Timed out:
// the test fails too, as inconclusive (a check that cannot conclude is no
// pass: make the history smaller), with the visualization of what was
// explored. It returns porcupine's result.
func checkLinearizable(t testing.TB, history []histOp, timeout time.Duration) porcupine.CheckResult {
	t.Helper()
	for _, op := range history {
		if op.Kind == opRead && op.Outcome == opOK && op.Value == tornValue {
			t.Logf("client %d read a block no single write wrote (torn or foreign data): block %d at %s on %s", op.Client, op.Block, op.Return, op.Node)
		}
	}
	ops := porcupineHistory(history)
	began := time.Now()
	res, info := porcupine.CheckOperationsVerbose(registerModel, ops, timeout)
	took := time.Since(began).Round(time.Millisecond)
	if res == porcupine.Ok {
		t.Logf("linearizability: ok in %s (%s)", took, historySummary(history))
		return res
	}
	path := ""
	if f, err := os.CreateTemp("", "replvol-linearizability-*.html"); err != nil {
		t.Logf("linearizability: cannot write the visualization: %v", err)
	} else {
		err := porcupine.Visualize(registerModel, info, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Logf("linearizability: writing the visualization %s: %v", f.Name(), err)
		}
		path = f.Name()
	}
	switch res {
	case porcupine.Illegal:
		t.Errorf("linearizability: the history is NOT linearizable (%s; checked in %s); visualization: %s", historySummary(history), took, path)
	default:
		t.Errorf("linearizability: inconclusive, the check timed out after %s (%s); make the history smaller; partial visualization: %s", timeout, historySummary(history), path)
	}
	return res
}
