package main

// Asynchronous replication end to end (issue 10): protocols A, B and C,
// congestion and lag, with replnode processes and real clients, on
// 127.0.0.1 or in network namespaces with a throttled link (tc tbf).

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/replication"
)

// crashConsistencyOpts shapes one run of the crash-consistency loop.
type crashConsistencyOpts struct {
	Rounds int
	// Size is the volume's size; each round writes its own area of
	// Size/Rounds bytes, so that no round's records hide another's.
	Size int64
	// PerBatch is how many 4 KiB records a batch has.
	PerBatch int
	// The primary is killed a random time in [KillAfterMin, KillAfterMax)
	// after the writer started.
	KillAfterMin, KillAfterMax time.Duration
	// Rate, when set, throttles the primary's eth0 while it takes writes
	// (network namespaces); the link is freed again after the kill.
	Rate                   string
	OnCongestion           string
	SendBuffer             int64
	WantBehindBytesInRound int64 // some round's lag sampled before the kill is at least this
}

// TestE2ECrashConsistencyUnderProtocolA: a client writes numbered records
// in batches, each followed by a FLUSH, to a protocol A primary, which is
// killed with SIGKILL at a random moment; the secondary is promoted
// (replctl primary --force) and must hold a prefix of the batches: batches
// 0..m whole, at most some records of batch m+1, nothing of any later
// batch, and at least every batch whose FLUSH was acknowledged before the
// kill. The killed node comes back as a Secondary of the new primary and
// catches up; the next round kills that primary. At the end an online
// verify finds nothing and the disks are equal.
//
// link-with-room: 20 rounds on 127.0.0.1, protocol A's defaults (the
// send buffer never fills). block-far-behind: 5 rounds in network
// namespaces, the primary's link throttled to 4 Mbit/s, on_congestion
// block and a 1 MiB send buffer, batches larger than the buffer: the
// peer is about a send buffer behind when the primary dies. The link is
// that slow so that it, not a writer starved of CPU, sets the pace: at
// 16 Mbit/s a loaded machine's writer wrote slower than the link, and the
// peer was never 512 KiB behind.
func TestE2ECrashConsistencyUnderProtocolA(t *testing.T) {
	e2eBeside(t)
	t.Run("link-with-room", func(t *testing.T) {
		runCrashConsistency(t, crashConsistencyOpts{
			Rounds: 20, Size: 256 << 20, PerBatch: 16,
			KillAfterMin: 50 * time.Millisecond, KillAfterMax: 500 * time.Millisecond,
		})
	})
	t.Run("block-far-behind", func(t *testing.T) {
		runCrashConsistency(t, crashConsistencyOpts{
			Rounds: 5, Size: 64 << 20, PerBatch: 320, // 1.25 MiB a batch
			KillAfterMin: 300 * time.Millisecond, KillAfterMax: 4 * time.Second,
			Rate: "4mbit", OnCongestion: "block", SendBuffer: 1 << 20,
			WantBehindBytesInRound: 512 << 10,
		})
	})
}

func runCrashConsistency(t *testing.T, o crashConsistencyOpts) {
	began := time.Now()
	c := newProcClusterN(t, clusterOpts{Size: o.Size, Protocol: "A", OnCongestion: o.OnCongestion,
		SendBuffer: o.SendBuffer, Netns: o.Rate != ""})
	c.startAll()
	c.waitInSync("alpha")
	seed := uint64(time.Now().UnixNano())
	rng := mrand.New(mrand.NewPCG(seed, 0x5eed))
	t.Logf("seed %d", seed)

	area := uint64(o.Size / int64(o.Rounds))
	primary, other := "alpha", "beta"
	var maxBehind int64
	for round := range o.Rounds {
		layout := batchLayout{Base: uint64(round) * area, PerBatch: o.PerBatch, Batches: int(area / (blockSize * uint64(o.PerBatch)))}
		nonce := rng.Uint64() | 1
		var dial dialFunc
		if c.lab != nil {
			c.throttle(primary, o.Rate)
			dial = c.lab.dialer(primary) // next to the primary: its replies are not throttled
		}
		w := startBatchWriter(c.dialExport(dial, primary, 10*time.Second), layout, nonce)
		killAfter := o.KillAfterMin + time.Duration(rng.Int64N(int64(o.KillAfterMax-o.KillAfterMin)))
		select {
		case <-w.done:
			t.Fatalf("round %d: the writer stopped before the kill (after batch %d; %v): make the area larger", round, w.flushed.Load(), w.err)
		case <-time.After(killAfter):
		}
		behind := int64(-1)
		if o.WantBehindBytesInRound > 0 {
			// How far behind the peer is, just before the kill. In the
			// last round, if no kill so far found the peer as far behind
			// as wanted (a busy machine writes slowly), the kill waits
			// until it is: that case is this run's point.
			lagNow := func() int64 {
				if v, err := c.asyncStatus(other); err == nil {
					if r := v.replica(other); r != nil {
						return r.LagBytes
					}
				}
				return -1
			}
			behind = lagNow()
			if round == o.Rounds-1 && max(maxBehind, behind) < o.WantBehindBytesInRound {
				within(30*time.Second, 20*time.Millisecond, func() bool {
					if behind = lagNow(); behind >= o.WantBehindBytesInRound {
						return true
					}
					select {
					case <-w.done:
						return true
					default:
						return false
					}
				})
			}
			maxBehind = max(maxBehind, behind)
		}
		flushedBeforeKill := w.flushed.Load()
		c.kill(primary)
		w.wait(t, 20*time.Second)
		started := w.started.Load()
		if c.lab != nil {
			c.unthrottle(primary)
		}
		promoting := time.Now()
		c.forcePrimary(other)
		rd := c.dialExport(nil, other, 10*time.Second)
		took := time.Since(promoting)
		res, err := checkBatches(rd.read, layout, nonce, int(started)+1)
		rd.close()
		if err != nil {
			t.Fatalf("round %d: reading the records on %s: %v", round, other, err)
		}
		lag := ""
		if behind >= 0 {
			lag = fmt.Sprintf(", the peer %d KiB behind", behind>>10)
		}
		t.Logf("round %2d: kill -9 %s %4dms into the run%s: %d batches flushed, %d begun; %s serves after %s and holds %d whole, %d/%d records of the next",
			round, primary, killAfter.Milliseconds(), lag, flushedBeforeKill+1, started+1, other, took.Round(time.Millisecond), res.Complete+1, res.PartialRecords, o.PerBatch)
		if len(res.Problems) > 0 {
			t.Fatalf("round %d: %s does not hold a prefix of the flushed batches:\n  %s", round, other, strings.Join(res.Problems, "\n  "))
		}
		if int64(res.Complete) < flushedBeforeKill {
			t.Fatalf("round %d: the FLUSH after batch %d was acknowledged before the kill, but %s holds batches 0..%d whole only (%d/%d records of batch %d)",
				round, flushedBeforeKill, other, res.Complete, res.PartialRecords, o.PerBatch, res.Complete+1)
		}

		// The killed node comes back as the new primary's Secondary.
		c.start(primary)
		c.waitForEvery(50*time.Millisecond, other, fmt.Sprintf("round %d: %s back as an UpToDate Secondary of %s", round, primary, other), syncTimeout, func(v *volumeStatus) bool {
			r := v.replica(primary)
			return v.Primary == other && r != nil && r.Role == "Secondary" && v.inSync()
		})
		primary, other = other, primary
	}
	if o.WantBehindBytesInRound > 0 && maxBehind < o.WantBehindBytesInRound {
		t.Errorf("the peer was at most %d bytes behind just before a kill, want at least %d in some round", maxBehind, o.WantBehindBytesInRound)
	}
	out := c.mustCtl(primary, "verify", volName, "--wait")
	if !strings.Contains(out, " 0B out of sync") {
		t.Fatalf("verify after %d rounds: %s", o.Rounds, out)
	}
	compareFiles(t, c.disk("alpha"), c.disk("beta"), o.Size)
	t.Logf("%d rounds in %s", o.Rounds, time.Since(began).Round(time.Millisecond))
}

// TestE2EProtocolGuaranteesOnPrimaryCrash: each protocol's promise when
// the primary's host dies (its link cut, then kill -9, so nothing more
// leaves it) and the secondary is promoted by hand. Clients write next
// to the primary, in its network namespace; every acknowledged write is
// recorded and read back from the new primary.
//   - C: a write completes once the peer wrote it: none is lost.
//   - B: once the peer received it: it survives the primary's crash too.
//   - A: once queued for the peer: acknowledged writes may be lost, but
//     never more than the lag status showed just before the crash. The
//     primary's link is throttled so that there is lag: with
//     on_congestion block (writes queued in the send buffer), and with
//     pull-ahead (the peer Behind, its blocks marked), where the clients
//     stop as soon as status shows the peer Behind, before the catch-up
//     would make it Inconsistent.
func TestE2EProtocolGuaranteesOnPrimaryCrash(t *testing.T) {
	e2eBeside(t)
	for _, tc := range []struct {
		name, protocol, onCongestion string
		sendBuffer                   int64
		rate                         string // the primary's link
	}{
		{name: "C", protocol: "C"},
		{name: "B", protocol: "B"},
		{name: "A-block", protocol: "A", onCongestion: "block", sendBuffer: 4 << 20, rate: "8mbit"},
		{name: "A-pull-ahead", protocol: "A", onCongestion: "pull-ahead", sendBuffer: 1 << 20, rate: "8mbit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e2eBeside(t)
			const size = 64 << 20
			c := newProcClusterN(t, clusterOpts{Netns: true, Size: size, Protocol: tc.protocol,
				OnCongestion: tc.onCongestion, SendBuffer: tc.sendBuffer})
			c.startAll()
			c.waitInSync("alpha")
			if tc.rate != "" {
				c.throttle("alpha", tc.rate)
			}
			aw := startAckWriter(t, c.targetsFrom("alpha"), ackWriterOpts{Writers: 2, Base: 0, Limit: size, OpTimeout: 3 * time.Second})
			aw.waitAck(t, time.Time{}, 15*time.Second, "write #500 acknowledged by alpha", func(a ackedWrite) bool { return a.Seq >= 500 })

			if tc.protocol == "A" {
				// Wait for lag (in the send buffer, or marked while
				// Behind), stop the clients, then read the lag: from
				// then on it can only shrink.
				var v *volumeStatus
				var err error
				if !within(20*time.Second, 50*time.Millisecond, func() bool {
					v, err = c.asyncStatus("alpha")
					var b *replicaStatus
					if err == nil {
						b = v.replica("beta")
					}
					if b != nil && tc.onCongestion == "block" && b.LagBytes >= tc.sendBuffer/2 {
						return true
					}
					if b != nil && tc.onCongestion == "pull-ahead" && b.Replication == "Behind" {
						if b.Disk != "UpToDate" {
							t.Fatalf("beta Behind but %s the first time status shows it", b.Disk)
						}
						return true
					}
					return false
				}) {
					t.Fatalf("no lag to speak of after 20 s (%v): %+v", err, v)
				}
				aw.stop()
			}
			v, err := c.asyncStatus("alpha")
			if err != nil {
				t.Fatal(err)
			}
			sample := v.replica("beta")
			if sample == nil {
				t.Fatalf("status lists no replica beta: %+v", v)
			}
			c.partition("alpha")
			c.kill("alpha")
			// Back on the bridge before the nodes stop, so that alpha's
			// orphaned sockets end and its namespace goes at once.
			t.Cleanup(func() { c.heal("alpha") })
			acked, unacked := aw.stop()
			t.Logf("protocol %s: beta %s/%s, lag %d bytes (%.3f s) just before the crash; %d writes acknowledged by alpha, %d not",
				v.Protocol, sample.Disk, sample.Replication, sample.LagBytes, sample.LagSeconds, len(acked), len(unacked))
			if v.Protocol != tc.protocol {
				t.Errorf("status shows protocol %q, want %s", v.Protocol, tc.protocol)
			}
			if tc.protocol == "A" && (sample.Disk != "UpToDate" || sample.LagBytes <= 0) {
				t.Fatalf("just before the crash beta is %s with a lag of %d bytes: want UpToDate, and some lag", sample.Disk, sample.LagBytes)
			}

			promoting := time.Now()
			c.forcePrimary("beta")
			c.dialExport(nil, "beta", 10*time.Second).close()
			t.Logf("beta serves %s after the promotion began", time.Since(promoting).Round(time.Millisecond))
			onBeta := nbdTargets{nodes: []string{"beta"}, uris: map[string]string{"beta": c.uri("beta")}}
			if tc.protocol != "A" {
				verifyAcked(t, onBeta, acked, unacked, 30*time.Second)
				return
			}
			ft := &fakeTB{TB: t}
			lost := verifyAcked(ft, onBeta, acked, unacked, 30*time.Second)
			lostBytes := int64(len(lost)) * blockSize
			t.Logf("protocol A: %d acknowledged writes (%d bytes) lost on failover; status showed a lag of %d bytes just before", len(lost), lostBytes, sample.LagBytes)
			if lostBytes > sample.LagBytes {
				t.Fatalf("protocol A lost %d bytes of acknowledged writes, more than the lag of %d bytes status showed just before the crash:\n%s",
					lostBytes, sample.LagBytes, strings.Join(ft.msgs, "\n"))
			}
		})
	}
}

// TestE2EProtocolChangesOnlineUnderFioVerify: fio writes random 4 KiB
// blocks with CRC32-C checksums and reads them back through the primary
// while `replctl adjust` switches the protocol every 300 ms (A with
// pull-ahead or block, B, C), until the whole cycle of changes happened
// under fio (fio runs again, on a fresh area, until it has): fio sees no
// error and no corruption, every adjust is accepted on both nodes, status
// shows the last protocol, the replicas end in sync with nothing
// resynced, and an online verify finds nothing.
func TestE2EProtocolChangesOnlineUnderFioVerify(t *testing.T) {
	e2eBeside(t)
	fio := RequireTool(t, "fio", "fio")
	const (
		size    = 64 << 20
		fioSize = 16 << 20 // a run's area; run k writes at k × fioSize
	)
	c := newProcClusterN(t, clusterOpts{Size: size, Protocol: "C"})
	c.startAll()
	c.waitInSync("alpha")
	resyncedBefore := c.mustStatus("alpha").replica("beta").Resynced

	type change struct{ protocol, onCongestion string }
	cycle := []change{{"A", "pull-ahead"}, {"B", ""}, {"C", ""}, {"A", "block"}, {"C", ""}, {"B", ""}, {"A", ""}}
	var changed atomic.Int64
	stop := make(chan struct{})
	type adjustLog struct{ done, failed []string }
	adjusted := make(chan adjustLog)
	go func() {
		var l adjustLog
		defer func() { adjusted <- l }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			ch := cycle[i%len(cycle)]
			args := []string{"adjust", volName, "--protocol", ch.protocol}
			if ch.onCongestion != "" {
				args = append(args, "--on-congestion", ch.onCongestion)
			}
			r := c.ctl("alpha", args...)
			want := "protocol " + ch.protocol
			if !r.ok() || !strings.Contains(r.out, "on alpha: "+want) || !strings.Contains(r.out, "on beta: "+want) {
				l.failed = append(l.failed, fmt.Sprintf("replctl %s: %s", strings.Join(args, " "), r))
				continue
			}
			l.done = append(l.done, ch.protocol)
			changed.Add(1)
		}
	}()
	var fioErr error
	runs := 0
	for deadline := time.Now().Add(2 * time.Minute); fioErr == nil && (runs == 0 || changed.Load() < int64(len(cycle))) && time.Now().Before(deadline); runs++ {
		off := int64(runs%(size/fioSize)) * fioSize
		r := runCmdIn(t.TempDir(), 2*time.Minute, nil, fio, "--name=verify", "--ioengine=nbd", "--uri="+c.uri("alpha"),
			"--rw=randwrite", "--bs=4k", fmt.Sprintf("--offset=%d", off), fmt.Sprintf("--size=%d", fioSize), "--iodepth=16",
			"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0", "--output-format=json")
		if !r.ok() {
			fioErr = fmt.Errorf("fio verify run %d while the protocol changed: %s", runs, r)
			break
		}
		res, err := parseFio(r.out)
		if err == nil && (res.Error != 0 || res.Write.IOBytes != fioSize || res.Read.IOBytes != fioSize) {
			err = fmt.Errorf("fio verify run %d: error %d, wrote %d, verified %d bytes (want %d each)", runs, res.Error, res.Write.IOBytes, res.Read.IOBytes, fioSize)
		}
		fioErr = err
	}
	close(stop)
	l := <-adjusted
	t.Logf("%d fio runs; %d protocol changes meanwhile: %s", runs, len(l.done), strings.Join(l.done, " "))
	if fioErr != nil {
		t.Fatal(fioErr)
	}
	if len(l.failed) > 0 {
		t.Fatalf("%d of %d adjusts failed:\n%s", len(l.failed), len(l.done)+len(l.failed), strings.Join(l.failed, "\n"))
	}
	if len(l.done) < len(cycle) {
		t.Fatalf("only %d protocol changes happened while fio ran for 2 minutes: want %d", len(l.done), len(cycle))
	}
	av, err := c.asyncStatus("alpha")
	if err != nil {
		t.Fatal(err)
	}
	if last := l.done[len(l.done)-1]; av.Protocol != last {
		t.Errorf("status shows protocol %q after the last adjust to %s", av.Protocol, last)
	}
	v := c.waitInSync("alpha")
	if moved := v.replica("beta").Resynced - resyncedBefore; moved != 0 {
		t.Errorf("the protocol changes cost a resync of %d bytes, want none", moved)
	}
	out := c.mustCtl("alpha", "verify", volName, "--wait")
	if !strings.Contains(out, " 0B out of sync") {
		t.Fatalf("verify after fio: %s", out)
	}
	compareFiles(t, c.disk("alpha"), c.disk("beta"), size)
}

// TestE2EPullAheadOverASlowLink: each node in its own network namespace,
// fio (8 KiB random writes, queue depth 16) runs next to the primary under
// protocol A with pull-ahead while alpha's link is throttled. Protocol A
// with pull-ahead acknowledges writes before the peer has them: fio gets
// more bytes acknowledged than the link could have carried in that time
// plus the send buffer (a write that waited for the link, as under
// on_congestion block, could not), status shows beta Behind (alpha Ahead)
// with its lag while fio runs, and once the link is free every write
// arrives: beta catches up, an online verify finds nothing and the disks
// are equal. Pull-ahead comes either from the file (with a 1 MiB send
// buffer, over 8 Mbit/s), or from A's own default: a volume on protocol C
// whose file names no policy, changed by `replctl adjust --protocol A`
// and nothing else (the default send buffer of 64 MiB, over 8 Mbit/s:
// over 40 Mbit/s, fio on a loaded machine wrote 10.5 MB/s, less than the
// link and the buffer take in its 10 s, and the test could not tell pull-
// ahead from writes that wait). How fast
// pull-ahead writes against local-only is a benchmark's figure, not this
// test's: make bench's protocols table (cmd/replbench protocols.go,
// replvol-A and replvol-local beside nbdkit).
func TestE2EPullAheadOverASlowLink(t *testing.T) {
	e2e(t)
	for _, tc := range []struct {
		name       string
		opts       clusterOpts
		rate       string
		bitsPerSec int64
		adjust     bool
	}{
		{"named in the file", clusterOpts{Protocol: "A", OnCongestion: "pull-ahead", SendBuffer: 1 << 20}, "8mbit", 8e6, false},
		{"protocol A's default after adjust", clusterOpts{Protocol: "C"}, "8mbit", 8e6, true},
	} {
		t.Run(tc.name, func(t *testing.T) { runPullAheadOverASlowLink(t, tc.opts, tc.rate, tc.bitsPerSec, tc.adjust) })
	}
}

func runPullAheadOverASlowLink(t *testing.T, opts clusterOpts, rate string, bitsPerSec int64, adjust bool) {
	fio := RequireTool(t, "fio", "fio")
	const (
		size    = 64 << 20
		runtime = 10 * time.Second
	)
	opts.Netns, opts.Size = true, size
	sendBuffer := opts.SendBuffer
	if sendBuffer == 0 {
		sendBuffer = replication.DefaultSendBuffer // the file names none
	}
	c := newProcClusterN(t, opts)
	c.startAll()
	c.waitInSync("alpha")
	if adjust {
		c.mustCtl("alpha", "adjust", volName, "--protocol", "A")
		c.waitFor("alpha", "status shows protocol A with its default policy, pull-ahead", 10*time.Second, func(v *volumeStatus) bool {
			return v.Protocol == "A" && v.OnCongestion == "pull-ahead"
		})
	}
	c.throttle("alpha", rate)
	// fio runs from inside alpha's namespace (over lo: its own traffic is
	// not throttled); only the replication to beta crosses the slow link.
	type fioRun struct {
		res  fioResult
		err  error
		took time.Duration
	}
	fioDone := make(chan fioRun, 1)
	go func() {
		began := time.Now()
		r := runCmdIn(t.TempDir(), time.Minute+runtime, nil, c.lab.ipBin, "netns", "exec", c.lab.namespace("alpha"), fio,
			"--name=slowlink", "--ioengine=nbd", "--uri="+c.uri("alpha"), "--rw=randwrite", "--bs=8k", "--size=32M",
			"--iodepth=16", fmt.Sprintf("--runtime=%d", int(runtime.Seconds())), "--time_based", "--randrepeat=0", "--output-format=json")
		took := time.Since(began)
		if !r.ok() {
			fioDone <- fioRun{err: fmt.Errorf("fio in alpha's namespace: %s", r), took: took}
			return
		}
		res, err := parseFio(r.out)
		if err == nil && (res.Error != 0 || res.Write.IOBytes <= 0) {
			err = fmt.Errorf("fio: error %d, %d bytes written", res.Error, res.Write.IOBytes)
		}
		fioDone <- fioRun{res, err, took}
	}()
	var (
		sawBehind     bool
		maxLag        int64
		maxLagSeconds float64
		states        []string
		run           fioRun
	)
	for polling := true; polling; {
		select {
		case run = <-fioDone:
			polling = false
			continue
		default:
		}
		if v, err := c.asyncStatus("beta"); err == nil {
			a, b := v.replica("alpha"), v.replica("beta")
			if a != nil && b != nil {
				st := a.Replication + "/" + b.Replication
				if len(states) == 0 || states[len(states)-1] != st {
					states = append(states, st)
				}
				if b.Replication == "Behind" && a.Replication == "Ahead" {
					sawBehind = true
					if b.LagBytes > maxLag {
						maxLag, maxLagSeconds = b.LagBytes, b.LagSeconds
					}
				}
			}
		}
		select {
		case run = <-fioDone:
			polling = false
		case <-time.After(100 * time.Millisecond):
		}
	}
	if run.err != nil {
		t.Fatal(run.err)
	}
	// What the link could have carried while fio ran (its whole run,
	// connecting included), the send buffer's worth queued on top, and
	// tbf's burst and fio's queue in flight as slack.
	carried := int64(run.took.Seconds()*float64(bitsPerSec)/8) + sendBuffer + 1<<20
	acked := run.res.Write.IOBytes
	t.Logf("over a %s link with pull-ahead: %d bytes acknowledged in %s, the link could carry %d with the send buffer; states seen (alpha/beta): %s; largest lag while Behind: %d bytes, %.2f s",
		rate, acked, run.took.Round(time.Millisecond), carried, strings.Join(states, " → "), maxLag, maxLagSeconds)
	if acked <= carried {
		t.Errorf("over a %s link with pull-ahead fio got %d bytes acknowledged in %s, no more than the link carries with a %d-byte send buffer (%d): the writes waited for the peer",
			rate, acked, run.took.Round(time.Millisecond), sendBuffer, carried)
	}
	if !sawBehind || maxLag <= 0 {
		t.Errorf("status never showed beta Behind (alpha Ahead) with a lag while fio ran over the slow link")
	}

	c.unthrottle("alpha")
	caughtUp := time.Now()
	c.waitInSync("alpha")
	t.Logf("link free: beta caught up in %s", time.Since(caughtUp).Round(time.Millisecond))
	out := c.mustCtl("alpha", "verify", volName, "--wait")
	if !strings.Contains(out, " 0B out of sync") {
		t.Errorf("status says in sync, but verify after the catch-up finds: %s", lastLine(out))
	}
	compareFiles(t, c.disk("alpha"), c.disk("beta"), size)
}

// TestE2EPullAheadCatchUpKeepsEveryOverwrite: under pull-ahead over a slow
// link the primary goes Ahead, catches up, goes Ahead again while the
// catch-up's runs are on the wire, and so on, while 16 clients overwrite
// random 4 KiB blocks of a 16 MiB area (each client its own blocks, so
// the last acknowledged write of every block is known). Once the link is
// free and status says in sync, every block on both disks holds its last
// acknowledged write: a catch-up run read before an overwrite must not
// clear the mark that overwrite set.
func TestE2EPullAheadCatchUpKeepsEveryOverwrite(t *testing.T) {
	e2eBeside(t)
	const (
		size    = 64 << 20
		area    = 16 << 20
		clients = 16
	)
	c := newProcClusterN(t, clusterOpts{Netns: true, Size: size, Protocol: "A", OnCongestion: "pull-ahead", SendBuffer: 1 << 20})
	c.startAll()
	c.waitInSync("alpha")
	c.throttle("alpha", "8mbit")

	blocks := area / blockSize
	last := make([]atomic.Uint64, blocks) // the last acknowledged write of each block
	var seq atomic.Uint64
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := dialRawNBDVia(ctx, c.lab.dialer("alpha"), c.uri("alpha"), 2*time.Second, 15*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer conn.close()
			rng := mrand.New(mrand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				b := rng.IntN(blocks/clients)*clients + g
				s, off := seq.Add(1), uint64(b)*blockSize
				if errno, err := conn.write(off, ackPattern(s, off)); err != nil || errno != 0 {
					errs <- fmt.Errorf("write #%d at %d: errno %d, %v", s, off, errno, err)
					return
				}
				last[b].Store(s)
			}
		}()
	}
	// Write until a catch-up was cut short by Ahead (SyncSource, then
	// Ahead again), or 15 s.
	var states []string
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && !strings.Contains(strings.Join(states, " "), "SyncSource Ahead") {
		if v, err := c.asyncStatus("beta"); err == nil {
			if st := v.replica("alpha").Replication; len(states) == 0 || states[len(states)-1] != st {
				states = append(states, st)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d writes; alpha went %s", seq.Load(), strings.Join(states, " → "))

	c.unthrottle("alpha")
	c.waitInSync("alpha")
	out := c.mustCtl("alpha", "verify", volName, "--wait")
	t.Logf("verify once status said in sync: %s", lastLine(out))
	for _, node := range []string{"alpha", "beta"} {
		disk, err := os.ReadFile(c.disk(node))
		if err != nil {
			t.Fatal(err)
		}
		var stale []string
		n := 0
		for b := range blocks {
			s := last[b].Load()
			if s == 0 {
				continue
			}
			off := uint64(b) * blockSize
			if got := disk[off : off+blockSize]; !bytes.Equal(got, ackPattern(s, off)) {
				n++
				if len(stale) < 10 {
					stale = append(stale, fmt.Sprintf("block at %d: last acknowledged write #%d, holds %s", off, s, describeBlock(got)))
				}
			}
		}
		if n > 0 {
			t.Errorf("%s, in sync by status, lacks the last acknowledged write of %d blocks (%d KiB):\n  %s", node, n, n*blockSize>>10, strings.Join(stale, "\n  "))
		}
	}
}
