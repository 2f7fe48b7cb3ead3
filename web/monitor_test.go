package web

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/replvol/replvol/transport"
)

// When the monitor samples, in a bubble of fake time: every idleInterval
// with no page open, every viewedInterval with one, every busyInterval
// while a resync runs on an open page, and eventDelay after any event of
// the node, so an incident reaches the page at once.

func TestMonitorSamplingSchedule(t *testing.T) {
	cases := []struct {
		name    string
		viewers int32
		bend    func(st *transport.ClusterStatus)
		want    time.Duration
	}{
		{name: "no page open", want: idleInterval},
		{name: "a page open", viewers: 1, want: viewedInterval},
		{name: "a page open during a resync", viewers: 2, want: busyInterval, bend: func(st *transport.ClusterStatus) {
			b := st.Volumes[0].Replica("beta")
			b.Disk, b.Replication, b.ResyncDoneBytes, b.ResyncTotalBytes = "Inconsistent", "SyncTarget", 1, 2
		}},
		// A sample reads every volume: with none open, a large cluster
		// is sampled less often, in proportion, down to a limit.
		{name: "no page open, 300 volumes", want: 3 * idleInterval, bend: volumes(300)},
		{name: "no page open, 1000 volumes", want: maxIdleInterval, bend: volumes(1000)},
		{name: "a page open, 1000 volumes", viewers: 1, want: viewedInterval, bend: volumes(1000)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				st := healthyCluster()
				if tc.bend != nil {
					tc.bend(st)
				}
				m := newMonitor(ctx, newFakeSource(st).sourceUntil(ctx))
				m.viewers.Store(tc.viewers)
				m.start()
				synctest.Wait()
				first, _ := m.current()
				if first == nil {
					t.Fatal("no sample at start")
				}
				time.Sleep(tc.want - time.Millisecond)
				synctest.Wait()
				if f, _ := m.current(); f != first {
					t.Fatalf("sampled again after %s, want %s", f.At.Sub(first.At), tc.want)
				}
				time.Sleep(time.Millisecond)
				synctest.Wait()
				if f, _ := m.current(); f == first {
					t.Fatalf("no new sample after %s", tc.want)
				}
			})
		})
	}
}

// volumes makes a cluster of n volumes, each like its first.
func volumes(n int) func(st *transport.ClusterStatus) {
	return func(st *transport.ClusterStatus) {
		for i := len(st.Volumes); i < n; i++ {
			v := st.Volumes[0]
			v.Name = fmt.Sprintf("vol%d", i)
			st.Volumes = append(st.Volumes, v)
		}
	}
}

func TestMonitorSamplesSoonAfterAnEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		fake := newFakeSource(healthyCluster())
		m := newMonitor(ctx, fake.sourceUntil(ctx))
		m.viewers.Store(1)
		m.start()
		synctest.Wait()
		first, _ := m.current()

		time.Sleep(viewedInterval / 4)
		fake.set(func(st *transport.ClusterStatus) { st.Volumes[0].Replica("beta").Replication = "StandAlone" })
		fake.emit(transport.Event{Seq: 1, Time: time.Now(), Node: "alpha", Volume: "vol0", Kind: "peer-lost", Message: "beta gone"})
		synctest.Wait()
		time.Sleep(eventDelay)
		synctest.Wait()
		f, _ := m.current()
		if f == first {
			t.Fatalf("no sample %s after the event", eventDelay)
		}
		if got, want := f.At.Sub(first.At), viewedInterval/4+eventDelay; got != want {
			t.Errorf("sampled %s after the first, want %s", got, want)
		}
		var warnings, events string
		for _, s := range f.Sections {
			switch s.ID {
			case "warnings":
				warnings = s.HTML
			case "events":
				events = s.HTML
			}
		}
		if !strings.Contains(warnings, "warning-standalone-vol0-beta") || !strings.Contains(events, "beta gone") {
			t.Errorf("the sample after the event lacks the warning or the event:\n%s\n%s", warnings, events)
		}
	})
}
