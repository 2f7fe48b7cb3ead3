package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestE2ESIGTERMOfAPrimaryUnderWritesCostsTheClientNoError: two data nodes
// and a witness; a client writes without pause, one request at a time, and
// follows the primary. Ten times the primary gets SIGTERM (systemctl stop)
// and is started again once the other node serves. Every write the client
// sent is answered: carried out, or refused with NBD_ESHUTDOWN (the NBD
// spec's "the server is shutting down: nothing was done, disconnect"),
// after which the client moves to the next primary. No write is cut off
// without an answer and none fails otherwise; every acknowledged write
// reads back at the end.
func TestE2ESIGTERMOfAPrimaryUnderWritesCostsTheClientNoError(t *testing.T) {
	e2e(t)
	const size = 128 << 20
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Size: size})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)

	const errnoShutdown = 108
	var (
		mu        sync.Mutex
		acked     []ackedWrite
		refused   int
		clientErr []string
		lastOK    = map[string]time.Time{}
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f := newFailoverNBD(c.targets(), 10*time.Second)
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
			switch {
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
	t.Logf("%d blocks written (the last write of each acknowledged), %d writes answered NBD_ESHUTDOWN during ten stops", len(acked), refused)
	for _, e := range clientErr {
		t.Errorf("client error: %s", e)
	}
	verifyAcked(t, c.targets(), acked, nil, 30*time.Second)
}
