package writepath

import (
	"slices"
	"testing"
)

// report is what each stage of a scripted run reports.
type report struct {
	logOK, detachOnLogFail  bool
	pulling                 bool
	trackFailed             bool
	localFailed, detachDisk bool
	acked, sourceAcked      bool
	peerFailed              bool
	leaseOK                 bool
}

// run drives a write through every stage with r's reports and returns
// the stages it ran, the wait it asked for and its outcome.
func run(t *testing.T, proto byte, toDisk bool, r report) ([]Stage, WaitMode, Outcome) {
	t.Helper()
	w := Begin(proto, toDisk)
	var stages []Stage
	mode := WaitMode(255)
	for range 20 {
		s := w.Next()
		stages = append(stages, s)
		switch s {
		case Log:
			w.Logged(r.logOK, r.detachOnLogFail)
		case Ship:
			w.Protocol(r.pulling)
			w.Shipped(r.trackFailed)
		case Drain:
			w.Drained()
		case Local:
			failed := w.ToDisk() && r.localFailed
			w.Wrote(failed && r.detachDisk, failed, r.pulling)
		case Wait:
			mode = w.WaitFor()
			w.Waited(r.acked, r.sourceAcked, r.peerFailed)
		case CountLag:
			w.Counted()
		case Lease:
			w.Leased(r.leaseOK)
		case Done:
			return stages, mode, w.Outcome()
		}
	}
	t.Fatalf("no Done after %v", stages)
	return nil, 0, 0
}

func TestTheExtentIsLoggedBeforeTheDataGoesAnywhere(t *testing.T) {
	for _, proto := range []byte{'A', 'B', 'C'} {
		stages, _, o := run(t, proto, true, report{logOK: true, acked: true, leaseOK: true})
		log, ship, local := slices.Index(stages, Log), slices.Index(stages, Ship), slices.Index(stages, Local)
		if log < 0 || ship < log || local < log {
			t.Errorf("protocol %c: stages %v: the log does not come first", proto, stages)
		}
		if o != Completed {
			t.Errorf("protocol %c: outcome %s", proto, o)
		}
	}
	// A write that does not go to the local disk needs no log entry.
	if stages, _, _ := run(t, 'C', false, report{acked: true, leaseOK: true}); slices.Contains(stages, Log) {
		t.Errorf("a write to a detached disk ran %v", stages)
	}
}

func TestAWaitIsAsTheProtocolSays(t *testing.T) {
	for _, c := range []struct {
		name        string
		proto       byte
		toDisk      bool
		r           report
		mode        WaitMode
		countsLag   bool
		wantOutcome Outcome
	}{
		{"C waits for every ack", 'C', true, report{logOK: true, leaseOK: true}, WaitAcks, false, Completed},
		{"B waits for receipts", 'B', true, report{logOK: true, leaseOK: true}, WaitReceipts, true, Completed},
		{"A does not wait", 'A', true, report{logOK: true, leaseOK: true}, WaitNone, true, Completed},
		{"A on a detached disk waits for every ack", 'A', false, report{acked: true, leaseOK: true}, WaitAcks, false, Completed},
		{"A while pulling waits for every ack", 'A', true, report{logOK: true, pulling: true, acked: true, sourceAcked: true, leaseOK: true}, WaitAcks, false, Completed},
		{"A whose disk failed and was detached waits for every ack", 'A', true, report{logOK: true, localFailed: true, detachDisk: true, acked: true, leaseOK: true}, WaitAcks, false, Completed},
		{"B whose log failed and was detached waits for every ack", 'B', true, report{detachOnLogFail: true, acked: true, leaseOK: true}, WaitAcks, false, Completed},
	} {
		stages, mode, o := run(t, c.proto, c.toDisk, c.r)
		if mode != c.mode || slices.Contains(stages, CountLag) != c.countsLag || o != c.wantOutcome {
			t.Errorf("%s: stages %v, wait %d, outcome %s; want wait %d, lag counted %t, %s", c.name, stages, mode, o, c.mode, c.countsLag, c.wantOutcome)
		}
	}
}

func TestAWriteFailsForTheFirstReasonThatHolds(t *testing.T) {
	for _, c := range []struct {
		name   string
		toDisk bool
		r      report
		want   Outcome
		last   Stage // the last stage before Done
	}{
		{"a log that fails and cannot detach", true, report{}, LogFailed, Log},
		{"a miss that cannot be tracked, at ship", true, report{logOK: true, trackFailed: true, acked: true, leaseOK: true}, TrackFailed, Drain},
		{"a miss that cannot be tracked, at the wait", true, report{logOK: true, peerFailed: true, localFailed: true, leaseOK: true}, PeerFailed, Wait},
		{"no copy anywhere", false, report{leaseOK: true}, NoCopy, Wait},
		{"a disk that failed and was detached, no ack", true, report{logOK: true, localFailed: true, detachDisk: true, leaseOK: true}, NoCopy, Wait},
		{"a pull's write no peer took", true, report{logOK: true, pulling: true, leaseOK: true}, PullNotTaken, Wait},
		{"a pull's write another peer than its source took", true, report{logOK: true, pulling: true, acked: true, leaseOK: true}, PullNotTaken, Wait},
		{"a local write that failed", true, report{logOK: true, localFailed: true, acked: true, leaseOK: true}, LocalFailed, Wait},
		{"a lease that ran out", true, report{logOK: true, acked: true}, LeaseLost, Lease},
	} {
		stages, _, o := run(t, 'C', c.toDisk, c.r)
		if o != c.want || len(stages) < 2 || stages[len(stages)-2] != c.last {
			t.Errorf("%s: stages %v, outcome %s; want %s after %s", c.name, stages, o, c.want, c.last)
		}
		// A write that failed never waits for the lease; no stage runs
		// after the local write when the ship failed.
		if c.want != LeaseLost && slices.Contains(stages, Lease) {
			t.Errorf("%s: a failed write ran %v", c.name, stages)
		}
		if c.want == TrackFailed && slices.Contains(stages, Local) {
			t.Errorf("%s: a write whose miss was not tracked was written here: %v", c.name, stages)
		}
	}
}

func TestAStageReportedOutOfOrderPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("a Local report before Log and Ship did not panic")
		}
	}()
	w := Begin('C', true)
	w.Wrote(false, false, false)
}
