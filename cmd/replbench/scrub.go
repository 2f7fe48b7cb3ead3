package main

// The scrub phase (issue 29): how fast replctl scrub reads a replica at
// full rate, against a plain sequential read of the same backing file.
// On replvol-nodes' alpha, once its fio runs are done: the backing file
// is written back and dropped from the page cache, then read from start
// to the volume's end in 1 MiB pieces (the reference); dropped again,
// then `replctl scrub vol0 --node alpha --rate 64GiB` runs, and its time
// is from the command to the scrub's last_finished in alpha's status.
// Rounds alternate which goes first. Goal: the scrub at >= 0.8x of the
// plain read.

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/replvol/replvol/transport"
)

// scrubGoal is the scrub's share of a plain sequential read (issue 29).
const scrubGoal = 0.8

type scrubReport struct {
	Setup string   `json:"setup,omitempty"`
	Scrub *cell    `json:"scrub_mb_s,omitempty"`
	Read  *cell    `json:"read_mb_s,omitempty"`
	Ratio *float64 `json:"ratio,omitempty"` // the scrub's median over the read's
	Error string   `json:"error,omitempty"`
}

func (b *bench) scrubPhase(ctx context.Context, t *target) (rep *scrubReport) {
	rep = &scrubReport{Setup: fmt.Sprintf("replvol-nodes' alpha: replctl scrub --rate 64GiB of %s against a sequential read of its backing file in 1 MiB pieces, both from a dropped page cache; %d rounds, alternating", fmtSize(b.cfg.size), b.cfg.rounds)}
	var scrubs, reads []float64
	defer func() {
		rep.Scrub, rep.Read = mkCell(scrubs), mkCell(reads)
		rep.Ratio = ratioOf(rep.Scrub, rep.Read)
	}()
	for round := 0; round < b.cfg.rounds; round++ {
		for i := range 2 {
			if _, err := dropFileCache(t.disk); err != nil {
				rep.Error = err.Error()
				return rep
			}
			if (round+i)%2 == 0 {
				mbs, err := readFileRate(t.disk, b.cfg.size)
				if err != nil {
					rep.Error = err.Error()
					return rep
				}
				logf("scrub: round %d/%d  plain read %.0f MB/s", round+1, b.cfg.rounds, mbs)
				reads = append(reads, mbs)
				continue
			}
			mbs, err := b.scrubRate(ctx, t)
			if err != nil {
				rep.Error = err.Error()
				return rep
			}
			logf("scrub: round %d/%d  scrub %.0f MB/s", round+1, b.cfg.rounds, mbs)
			scrubs = append(scrubs, mbs)
		}
	}
	return rep
}

// readFileRate reads size bytes of file from its start in 1 MiB pieces
// and returns MB/s.
func readFileRate(file string, size int64) (float64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	began := time.Now()
	n, err := io.CopyBuffer(io.Discard, io.LimitReader(f, size), buf)
	if err != nil {
		return 0, err
	}
	return float64(n) / 1e6 / time.Since(began).Seconds(), nil
}

// scrubRate runs a scrub of vol0 on alpha at full rate and returns MB/s:
// the volume's size over the time from the command to the scrub's end.
func (b *bench) scrubRate(ctx context.Context, t *target) (float64, error) {
	before, err := b.scrubStatus(ctx, t)
	if err != nil {
		return 0, err
	}
	began := time.Now()
	if out, err := b.replctlAt(ctx, t, "scrub", "vol0", "--node", "alpha", "--rate", "64GiB"); err != nil {
		return 0, fmt.Errorf("replctl scrub: %v: %s", err, out)
	}
	deadline := time.Now().Add(10 * time.Minute)
	for time.Now().Before(deadline) {
		st, err := b.scrubStatus(ctx, t)
		if err != nil {
			return 0, err
		}
		if st.LastFinished != nil && (before.LastFinished == nil || st.LastFinished.After(*before.LastFinished)) {
			if st.LastUnrecoverable > 0 {
				return 0, fmt.Errorf("the scrub found %d unrecoverable blocks", st.LastUnrecoverable)
			}
			return float64(b.cfg.size) / 1e6 / st.LastFinished.Sub(began).Seconds(), nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("the scrub did not end within 10 minutes")
}

// scrubStatus is alpha's scrub of vol0, from its own view (/api/node).
func (b *bench) scrubStatus(ctx context.Context, t *target) (transport.ScrubStatus, error) {
	var st transport.NodeStatus
	if err := getNodeView(ctx, t.control, 5*time.Second, &st); err != nil {
		return transport.ScrubStatus{}, fmt.Errorf("alpha's view: %w", err)
	}
	for _, v := range st.Volumes {
		if v.Name == "vol0" && v.Integrity != nil {
			return v.Integrity.Scrub, nil
		}
	}
	return transport.ScrubStatus{}, fmt.Errorf("alpha's view holds no integrity of vol0 (checksums off?)")
}
