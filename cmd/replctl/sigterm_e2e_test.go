package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"
)

// TestE2ESIGTERMOfAPrimaryUnderWritesCostsTheClientNoError: two data nodes
// and a witness; a client writes without pause, one request at a time, and
// follows the primary. Ten times the primary gets SIGTERM (systemctl stop)
// and is started again once the other node serves. Every write the server
// read is answered: carried out, or refused with NBD_ESHUTDOWN (the NBD
// spec's "the server is shutting down: nothing was done, disconnect"),
// after which the client moves to the next primary. A write the client
// sent as the server ended the connection, which the server never read,
// meets the connection's orderly end (EOF), never a reset, and was not
// carried out: its block does not hold it. No write fails otherwise; every
// acknowledged write reads back at the end.
func TestE2ESIGTERMOfAPrimaryUnderWritesCostsTheClientNoError(t *testing.T) {
	e2eBeside(t)
	const size = 128 << 20
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Size: size})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)

	const errnoShutdown = 108
	var (
		mu        sync.Mutex
		acked     []ackedWrite
		refused   int
		ended     []ackedWrite          // writes that met the connection's end: never read
		lastSent  = map[uint64]uint64{} // offset → the last write sent there
		clientErr []string
		lastOK    = map[string]time.Time{}
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// A request waits out an IO freeze (the primary's lease lapsing
		// while raft elects a leader on a starved machine) instead of
		// failing: what counts is a request left without an answer.
		f := newFailoverNBD(c.targets(), time.Minute)
		defer f.close()
		// The client goes round an area of the volume: the last write to
		// a block is the one that must read back.
		const base, slots = 8 << 20, (size - 8<<20) / blockSize
		latest := map[uint64]int{} // offset → index in acked
		for seq := uint64(0); ctx.Err() == nil; seq++ {
			off := base + seq%slots*blockSize
			if err := f.connect(ctx); err != nil {
				return
			}
			node := f.node
			errno, err := f.conn.write(off, ackPattern(seq, off))
			mu.Lock()
			lastSent[off] = seq
			switch {
			case errors.Is(err, io.EOF):
				// The server ended the connection in order after its
				// last reply: it never read this write.
				ended = append(ended, ackedWrite{Seq: seq, Off: off, Node: node, At: time.Now()})
				f.drop()
			case err != nil:
				clientErr = append(clientErr, fmt.Sprintf("write #%d on %s: no answer: %v", seq, node, err))
				f.drop()
			case errno == errnoShutdown:
				refused++
				f.close() // NBD_CMD_DISC, as the spec asks
			case errno != 0:
				clientErr = append(clientErr, fmt.Sprintf("write #%d on %s: errno %d", seq, node, errno))
				f.drop()
			default:
				aw := ackedWrite{Seq: seq, Off: off, Node: node, At: time.Now()}
				if i, ok := latest[off]; ok {
					acked[i] = aw
				} else {
					latest[off] = len(acked)
					acked = append(acked, aw)
				}
				lastOK[node] = time.Now()
			}
			mu.Unlock()
		}
	}()
	writesOn := func(node string, since time.Time) bool {
		mu.Lock()
		defer mu.Unlock()
		return lastOK[node].After(since)
	}
	waitWrites := func(node string, since time.Time, what string) {
		if !within(30*time.Second, 20*time.Millisecond, func() bool { return writesOn(node, since) }) {
			t.Fatalf("%s: no write acknowledged by %s", what, node)
		}
	}
	for round := 1; round <= 10; round++ {
		primary := c.waitSettled(witnessName, fmt.Sprintf("round %d", round)).Primary
		other := map[string]string{"alpha": "beta", "beta": "alpha"}[primary]
		waitWrites(primary, time.Time{}, fmt.Sprintf("round %d: before the stop", round))
		stopped := time.Now()
		c.stop(primary)
		waitWrites(other, stopped, fmt.Sprintf("round %d: after the stop of %s", round, primary))
		c.start(primary)
	}
	c.waitSettled(witnessName, "at the end")
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d blocks written (the last write of each acknowledged), %d writes answered NBD_ESHUTDOWN and %d met the connection's end during ten stops",
		len(acked), refused, len(ended))
	for _, e := range clientErr {
		t.Errorf("client error: %s", e)
	}
	verifyAcked(t, c.targets(), acked, nil, 30*time.Second)
	var unread []ackedWrite // ended writes whose block no later write touched
	for _, w := range ended {
		if lastSent[w.Off] == w.Seq {
			unread = append(unread, w)
		}
	}
	verifyNotCarriedOut(t, c.targets(), unread, 30*time.Second)
}

// verifyNotCarriedOut reads each write's block back through whichever node
// serves the export and fails the test for each that holds the write.
func verifyNotCarriedOut(t *testing.T, tg nbdTargets, writes []ackedWrite, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	f := newFailoverNBD(tg, 10*time.Second)
	defer f.close()
	for _, w := range writes {
		for {
			if err := f.connect(ctx); err != nil {
				t.Fatalf("verifyNotCarriedOut: %v", err)
			}
			data, node, outcome, err := f.read(ctx, w.Off, blockSize)
			if outcome == opOK {
				if bytes.Equal(data, ackPattern(w.Seq, w.Off)) {
					t.Errorf("write #%d at offset %d met the end of the connection to %s (the server never read it), yet %s holds it",
						w.Seq, w.Off, w.Node, node)
				}
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("verifyNotCarriedOut: read %d on %s: %v (%v)", w.Off, node, err, ctx.Err())
			}
		}
	}
	t.Logf("verifyNotCarriedOut: %d writes the server never read, and no later write touched, read back", len(writes))
}
