package node

import (
	"context"
	"fmt"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/replication"
)

// ruleNewerEpoch names the refusal a primary of a newer epoch gives an
// older primary: the older one is fenced.
const ruleNewerEpoch = "newer-epoch"

// syncPlan is what a primary does with a peer that just connected.
type syncPlan struct {
	// rule names the generation rule that decided and outcome what it
	// decided, for logs and status.
	rule, outcome string
	// sync: resync the blocks marked for the peer (this node is the
	// SyncSource); syncGen is the generation that bitmap starts from.
	sync    bool
	syncGen replication.Generation
	// pull: the peer holds newer data; this primary copies the blocks it
	// misses from the peer (it is the SyncTarget, and serves reads of
	// those blocks from the peer meanwhile), then takes peerGen.
	pull    bool
	peerGen replication.Generation
}

// bitmapRuns lists bm's marked blocks as [first, count] runs.
func bitmapRuns(bm *metadata.PeerBitmap) [][2]int64 {
	var runs [][2]int64
	for cur := int64(0); ; {
		start, n, ok := bm.NextRun(cur, 1<<20)
		if !ok {
			return runs
		}
		runs = append(runs, [2]int64{start, n})
		cur = start + n
	}
}

func runsBytes(runs [][2]int64) int64 {
	var n int64
	for _, r := range runs {
		n += r[1] * replication.BlockSize
	}
	return n
}

// decide compares this primary's generations with the peer's
// (replication.CompareUUIDs, DRBD's table) and prepares what the
// connection does. Callers hold v.genMu.
func (p *peer) decide(reply replication.HelloReply) (syncPlan, error) {
	v := p.v
	v.mu.Lock()
	defer v.mu.Unlock()
	d := replication.CompareUUIDs(v.uuidsLocked(p.name), reply.UUIDs, replication.Primary, replication.Secondary)
	plan := syncPlan{rule: d.Rule, outcome: d.Outcome.String()}
	mark := func(runs [][2]int64) {
		for _, r := range runs {
			p.bm.SetBits(r[0]*replication.BlockSize, r[1]*replication.BlockSize)
		}
	}
	switch {
	case !reply.DiscardFrom.IsZero():
		// The peer gives up its changes since the split: resync what it
		// changed and what we changed, if we share that starting point.
		// That point is this node's bitmap generation for the peer, or,
		// when it wrote nothing since, its current one.
		from, ok := v.bitmapGens[p.name]
		if !ok {
			from = v.gen
		}
		if from == reply.DiscardFrom {
			mark(reply.Discard)
			plan.rule, plan.outcome = "discard-my-data", replication.BitmapResyncSource.String()
		} else {
			p.bm.SetAll()
			plan.rule, plan.outcome = "discard-my-data-unrelated", replication.FullResyncSource.String()
		}
		plan.sync = true
	case d.Outcome == replication.UnrelatedData:
		return plan, &refusedError{rule: d.Rule}
	case d.Outcome.IsSplitBrain():
		return plan, &splitBrainError{
			reason:      fmt.Sprintf("%s and %s both changed the data since their last common generation (%v)", v.self, p.name, d),
			rule:        d.Rule,
			peerPrimary: reply.Primary,
			peer:        replication.SplitBrainSide{Changes: runsBytes(reply.Changed), PrimarySince: reply.PrimarySince},
		}
	case d.Outcome.IsTarget():
		if reply.Disk != replication.UpToDate && reply.Disk != replication.Consistent {
			return plan, &refusedError{rule: d.Rule, reason: fmt.Sprintf("%s holds newer data than this primary (%v) but its disk is %s: nothing consistent to copy", p.name, d, reply.Disk)}
		}
		// Everything this node marked for the peer is copied back from it
		// too: the peer's copy of those blocks is the one to keep (writes
		// made during a pull complete only on both nodes).
		for _, r := range bitmapRuns(p.bm) {
			v.localMissing.SetRange(r[0]*replication.BlockSize, r[1]*replication.BlockSize)
		}
		p.bm.ClearBits(0, v.size)
		if d.Outcome == replication.FullResyncTarget {
			v.localMissing.SetRange(0, v.size)
		} else {
			for _, r := range reply.Changed {
				v.localMissing.SetRange(r[0]*replication.BlockSize, r[1]*replication.BlockSize)
			}
		}
		// Inconsistent, durably, BEFORE any block is copied; the old
		// generation is kept to resume from.
		if !v.gen.IsZero() {
			v.gen, v.syncGen = replication.Generation{}, v.gen
		}
		delete(v.bitmapGens, p.name)
		v.diskState = replication.Inconsistent
		v.reason = fmt.Sprintf("%s holds newer data (%v): copying %d bytes from it", p.name, d, v.localMissing.Bytes())
		if err := v.persistLocked(false); err != nil {
			return plan, err
		}
		plan.pull, plan.peerGen = true, reply.UUIDs.Current
		return plan, nil
	default:
		if d.Repair != nil && !d.Repair.Bitmap.IsZero() {
			v.bitmapGens[p.name] = d.Repair.Bitmap
		}
		mark(reply.Changed)
		if d.Outcome == replication.FullResyncSource {
			p.bm.SetAll()
		}
		plan.sync = d.Outcome.IsSource() || p.bm.Count() > 0
		if d.Outcome == replication.NoResync && plan.sync {
			plan.outcome = replication.BitmapResyncSource.String() + " (blocks marked)"
		}
	}
	if v.gen.IsZero() {
		// This primary holds no consistent data and the peer holds none
		// newer: there is nothing to serve or to copy.
		return plan, &refusedError{rule: d.Rule, reason: fmt.Sprintf(
			"neither %s nor %s holds data of %s to copy (%v); make one node's data the volume's with replctl primary %s --node NODE --force --yes (a full resync to the other follows)",
			v.self, p.name, v.name, d, v.name)}
	}
	if !plan.sync {
		return plan, nil
	}
	// The peer's copy will be this bitmap's generation plus the blocks
	// sent; a resync that begins without one gets a fresh one, so that an
	// interrupted resync resumes from the bitmap (the peer reports it).
	g, ok := v.bitmapGens[p.name]
	if !ok || g.IsZero() {
		g = replication.NewGeneration()
		v.bitmapGens[p.name] = g
	}
	plan.syncGen = g
	return plan, v.persistLocked(false)
}

// pull copies from the peer every block this primary misses, then takes
// the peer's generation and tells the peer it is in sync. Reads of the
// missing blocks go to the peer meanwhile (DRBD 9's primary SyncTarget).
func (p *peer) pull(ctx context.Context, peerGen replication.Generation) error {
	v := p.v
	began, total := time.Now(), v.localMissing.Bytes()
	v.node.event(v.name, "pull", fmt.Sprintf("%s copies %d bytes of newer data from %s", v.self, total, p.name))
	for {
		unpaused := func() chan struct{} {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.unpaused
		}
		if err := v.copyMissingFromPeer(ctx, unpaused); err != nil {
			return err
		}
		v.genMu.Lock()
		v.mu.Lock()
		if v.localMissing.Count() > 0 {
			v.mu.Unlock()
			v.genMu.Unlock()
			continue
		}
		v.gen, v.syncGen = peerGen, replication.Generation{}
		v.diskState = replication.UpToDate
		v.reason = ""
		err := v.persistLocked(false)
		v.mu.Unlock()
		if err != nil {
			v.genMu.Unlock()
			return err
		}
		done := p.syncDone(peerGen)
		p.mu.Lock()
		if p.streaming {
			p.enqueueLocked(done)
		}
		p.mu.Unlock()
		p.pulling.Store(false)
		v.genMu.Unlock()
		p.kick()
		v.log.Info("pulled newer data from the peer", "peer", p.name, "bytes", total, "seconds", time.Since(began).Seconds())
		v.node.event(v.name, "pull-done", fmt.Sprintf("%s copied %d bytes from %s in %.1fs: UpToDate", v.self, total, p.name, time.Since(began).Seconds()))
		return nil
	}
}

// fence stops this primary's IO because a primary of a newer epoch exists
// (one writer): requests in flight complete, new ones fail. It stays
// Primary until that primary reaches it, then steps down, or finds a split
// brain. A peer that takes this node's stream again lifts the fence.
func (v *Volume) fence(reason string) {
	v.mu.Lock()
	if v.role != replication.Primary || v.fenced {
		v.mu.Unlock()
		return
	}
	v.fenced, v.ioOpen, v.reason = true, false, "fenced: "+reason
	v.mu.Unlock()
	v.log.Warn("fenced: a primary of a newer epoch exists; IO stopped", "reason", reason)
	v.node.event(v.name, "fenced", fmt.Sprintf("%s stops IO: %s", v.self, reason))
}

// stepDown makes a primary Secondary because a primary of a newer epoch
// reached it (h) and the generations say no data is lost by following it:
// requests in flight are answered, new ones are refused, and what this
// node changed stays marked for the new primary to copy. A write that
// completed since that comparison may have started a new generation, so
// once no write is in flight the comparison is made again; if it now finds
// a split brain, this node goes on serving and stays primary (the caller
// then refuses the stream as a split brain).
func (v *Volume) stepDown(h replication.Hello) error {
	v.mu.Lock()
	if v.role != replication.Primary {
		v.mu.Unlock()
		return nil
	}
	v.ioOpen = false
	v.mu.Unlock()
	v.io.Wait()
	v.mu.Lock()
	d := replication.CompareUUIDs(v.uuidsLocked(h.From), h.UUIDs, replication.Secondary, replication.Primary)
	if d.Outcome.IsSplitBrain() || d.Outcome == replication.UnrelatedData {
		v.ioOpen = !v.fenced
		v.mu.Unlock()
		return nil
	}
	v.mu.Unlock()
	to, epoch, rule := h.From, h.Epoch, d.String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	v.node.nbd.CloseExportContext(ctx, v.name)
	cancel()
	v.io.Wait()
	v.stopPeers()
	if err := v.md.FlushBitmaps(); err != nil {
		return err
	}
	v.mu.Lock()
	v.role, v.primary, v.epoch, v.fenced = replication.Secondary, to, epoch, false
	v.diskState = v.idleDiskState()
	err := v.persistLocked(false)
	v.mu.Unlock()
	if err != nil {
		return err
	}
	if err := v.md.SetPrimary(false); err != nil {
		return err
	}
	v.log.Warn("stepped down: a primary of a newer epoch took over", "primary", to, "epoch", epoch, "rule", rule)
	v.node.event(v.name, "stepped-down", fmt.Sprintf("%s is Secondary: %s is primary at epoch %d and nothing is lost by following it (%s)", v.self, to, epoch, rule))
	return nil
}
