package node

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

// Volumes added and removed while the nodes run (a SIGHUP of an edited
// cluster file): node.ApplyVolumes.

// withVolume returns c's config with volume name added: size bytes, a
// fresh disk on each of vol0's nodes, primary the given node. c.cfg is
// not changed.
func (c *testCluster) withVolume(name string, size int64, primary string) *Config {
	c.t.Helper()
	next := *c.cfg
	vc := VolumeConfig{Name: name, Size: VolumeSize(size), Protocol: "C", Primary: primary, Disks: map[string]DiskConfig{}}
	holders := slices.Sorted(maps.Keys(c.cfg.Volumes[0].Disks))
	for _, node := range holders {
		img := filepath.Join(c.dir, name+"-"+node+".img")
		if err := os.WriteFile(img, nil, 0o644); err != nil {
			c.t.Fatal(err)
		}
		if err := os.Truncate(img, deviceSizeFor(c.t, size, len(holders)-1)); err != nil {
			c.t.Fatal(err)
		}
		vc.Disks[node] = SinglePath(img)
	}
	next.Volumes = append(slices.Clone(c.cfg.Volumes), vc)
	if err := next.Validate(); err != nil {
		c.t.Fatal(err)
	}
	return &next
}

// apply hands node name the file next, as its SIGHUP does, and returns
// what it did.
func (c *testCluster) apply(name string, next *Config) []VolumeChange {
	c.t.Helper()
	return c.nodes[name].ApplyVolumes(next)
}

// statusOf returns volume name's status as node from assembles it.
func (c *testCluster) statusOf(from, name string) (*transport.ClusterStatus, *transport.VolumeStatus) {
	c.t.Helper()
	st, err := c.nodes[from].clusterStatus(context.Background(), 0)
	if err != nil {
		c.t.Fatal(err)
	}
	for i := range st.Volumes {
		if st.Volumes[i].Name == name {
			return st, &st.Volumes[i]
		}
	}
	return st, nil
}

// waitVolumeInSync waits until every replica of volume name is UpToDate
// and Connected.
func (c *testCluster) waitVolumeInSync(name string) {
	c.t.Helper()
	var vs *transport.VolumeStatus
	if !within(30*time.Second, 10*time.Millisecond, func() bool {
		_, vs = c.statusOf("alpha", name)
		if vs == nil {
			return false // not (yet) in alpha's status
		}
		ok := len(vs.Replicas) > 0
		for _, r := range vs.Replicas {
			ok = ok && r.Disk == "UpToDate" && r.Replication == "Connected" && r.OutOfSyncBytes == 0
		}
		return ok
	}) {
		c.t.Fatalf("replicas of %s not in sync: %+v", name, vs)
	}
}

// requireSameData fails unless the disks of volume vc hold the same size
// bytes on every node.
func requireSameData(t *testing.T, vc VolumeConfig) {
	t.Helper()
	var first []byte
	for _, node := range slices.Sorted(maps.Keys(vc.Disks)) {
		b, err := os.ReadFile(vc.Disks[node].Paths[0].Path)
		if err != nil {
			t.Fatal(err)
		}
		b = b[:vc.Size]
		if first == nil {
			first = b
			continue
		}
		if !bytes.Equal(first, b) {
			t.Fatalf("the disks of %s differ on %s", vc.Name, node)
		}
	}
}

func peerReason(v *Volume, peer string) string {
	for _, p := range v.status().Peers {
		if p.Node == peer {
			return p.ReasonCode
		}
	}
	return ""
}

func hasWarning(st *transport.ClusterStatus, kind, volume string) *transport.Warning {
	for i, w := range st.Warnings {
		if w.Kind == kind && w.Volume == volume {
			return &st.Warnings[i]
		}
	}
	return nil
}

// TestAVolumeAddedAtRuntimeSyncsAndServes: vol1 is added to a running
// cluster's file. alpha, its primary, applies it first: it serves vol1
// over NBD at once, beta refuses its stream in words (no-such-volume) and
// alpha keeps trying, and status warns that the files disagree. Once beta
// applies it too, beta syncs from alpha, both are UpToDate with the same
// data, and the warning is gone. vol0 runs on untouched.
func TestAVolumeAddedAtRuntimeSyncsAndServes(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	next := c.withVolume("vol1", 8<<20, "alpha")

	if got, want := c.apply("alpha", next), []VolumeChange{{Volume: "vol1", Op: VolumeAdded, Held: true}}; !slices.Equal(got, want) {
		t.Fatalf("alpha applied %+v, want %+v", got, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := nbdtest.Dial(ctx, c.nodes["alpha"].NBDAddr(), "vol1")
	if err != nil {
		t.Fatalf("vol1's export on alpha: %v", err)
	}
	defer cl.Close()
	if err := cl.Write(0, pattern(7, 256<<10), nbdtest.CmdFlagFUA); err != nil {
		t.Fatalf("write to vol1 before beta has it: %v", err)
	}
	a := c.nodes["alpha"].volumes()["vol1"]
	eventually(t, func() bool { return peerReason(a, "beta") == string(CauseNoVolume) }, "beta refuses vol1's stream: no-such-volume")
	st, _ := c.statusOf("beta", "vol1")
	if want := []transport.ConfigDifference{{Volume: "vol1", In: []string{"alpha"}, NotIn: []string{"beta"}}}; !slices.EqualFunc(st.ConfigDiffers, want, sameDifference) {
		t.Fatalf("status from beta: config_differs %+v, want %+v", st.ConfigDiffers, want)
	}
	w := hasWarning(st, transport.WarningConfigDiffers, "vol1")
	if w == nil || !strings.Contains(w.Text, "vol1 is in the cluster file of alpha but not in beta's") || w.Command != "systemctl reload replnode" {
		t.Fatalf("status warns %+v, want config-differs naming alpha, beta and the reload", st.Warnings)
	}

	if got, want := c.apply("beta", next), []VolumeChange{{Volume: "vol1", Op: VolumeAdded, Held: true}}; !slices.Equal(got, want) {
		t.Fatalf("beta applied %+v, want %+v", got, want)
	}
	c.waitVolumeInSync("vol1")
	if err := cl.Write(1<<20, pattern(8, 64<<10), nbdtest.CmdFlagFUA); err != nil {
		t.Fatal(err)
	}
	got, err := cl.Read(0, 256<<10)
	if err != nil || !bytes.Equal(got, pattern(7, 256<<10)) {
		t.Fatalf("vol1 reads back other data (%v)", err)
	}
	c.waitVolumeInSync("vol1")
	requireSameData(t, next.Volumes[1])
	st, vs := c.statusOf("beta", "vol1")
	if vs == nil || vs.Primary != "alpha" || st.ConfigDiffers != nil || hasWarning(st, transport.WarningConfigDiffers, "vol1") != nil {
		t.Fatalf("once both have it: vol1 %+v, config_differs %+v, warnings %+v", vs, st.ConfigDiffers, st.Warnings)
	}
	if _, err := nbdtest.Dial(ctx, c.nodes["beta"].NBDAddr(), "vol1"); err == nil {
		t.Fatal("beta, a secondary of vol1, serves it")
	}
	c.waitInSync()
}

func sameDifference(a, b transport.ConfigDifference) bool {
	return a.Volume == b.Volume && slices.Equal(a.In, b.In) && slices.Equal(a.NotIn, b.NotIn) && len(a.NotApplied) == len(b.NotApplied)
}

// addedInSync adds vol1 (primary alpha) to both nodes of a running
// two-node cluster and waits until it is in sync; it returns the file
// with vol1.
func addedInSync(t *testing.T, c *testCluster, size int64) *Config {
	t.Helper()
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	next := c.withVolume("vol1", size, "alpha")
	for _, n := range []string{"alpha", "beta"} {
		if ch := c.apply(n, next); len(ch) != 1 || ch[0].Err != nil {
			t.Fatalf("%s: %+v", n, ch)
		}
	}
	c.waitVolumeInSync("vol1")
	return next
}

// TestAVolumeRemovedAtRuntimeKeepsItsDiskAndResumesWithABitmapResync:
// vol1 is removed from beta's file first: beta stops it, alpha's stream is
// refused (no-such-volume) and alpha marks what beta misses. Then from
// alpha's: alpha stops it cleanly, its export is gone, both disks and
// both nodes' state stay, and vol0 serves on. Added back on both, vol1
// resumes: beta gets only the blocks written while it did not run vol1.
func TestAVolumeRemovedAtRuntimeKeepsItsDiskAndResumesWithABitmapResync(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 4<<20)
	next := addedInSync(t, c, 8<<20)
	ctx := context.Background()
	a := c.nodes["alpha"].volumes()["vol1"]
	if err := a.WriteAt(ctx, pattern(3, 1<<20), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	if got, want := c.apply("beta", c.cfg), []VolumeChange{{Volume: "vol1", Op: VolumeRemoved, Held: true}}; !slices.Equal(got, want) {
		t.Fatalf("beta applied %+v, want %+v", got, want)
	}
	if _, ok := c.nodes["beta"].volumes()["vol1"]; ok {
		t.Fatal("beta still runs vol1")
	}
	eventually(t, func() bool { return peerReason(a, "beta") == string(CauseNoVolume) }, "beta refuses vol1's stream once removed")
	if err := a.WriteAt(ctx, pattern(4, 64<<10), 2<<20, false); err != nil {
		t.Fatalf("alpha's write while beta does not run vol1: %v", err)
	}

	if got, want := c.apply("alpha", c.cfg), []VolumeChange{{Volume: "vol1", Op: VolumeRemoved, Held: true}}; !slices.Equal(got, want) {
		t.Fatalf("alpha applied %+v, want %+v", got, want)
	}
	if _, err := nbdtest.Dial(ctx, c.nodes["alpha"].NBDAddr(), "vol1"); err == nil {
		t.Fatal("alpha still exports vol1")
	}
	for _, n := range []string{"alpha", "beta"} {
		if _, err := os.Stat(next.Volumes[1].Disks[n].Paths[0].Path); err != nil {
			t.Fatalf("%s's disk of vol1 is gone: %v", n, err)
		}
		st, known, err := c.nodes[n].store.Volume("vol1")
		if err != nil || !known || !st.Clean {
			t.Fatalf("%s's state of vol1: %+v known %v clean %v (%v): want kept and marked clean", n, st, known, st.Clean, err)
		}
	}
	if st, _ := c.statusOf("alpha", "vol0"); st.ConfigDiffers != nil || len(st.Volumes) != 1 {
		t.Fatalf("with vol1 gone from both files: volumes %+v, config_differs %+v", st.Volumes, st.ConfigDiffers)
	}
	if err := c.vol("alpha").WriteAt(ctx, pattern(5, 4096), 0, false); err != nil {
		t.Fatalf("vol0 after vol1's removal: %v", err)
	}

	for _, n := range []string{"alpha", "beta"} {
		if ch := c.apply(n, next); len(ch) != 1 || ch[0].Err != nil || ch[0].Op != VolumeAdded {
			t.Fatalf("%s adds vol1 back: %+v", n, ch)
		}
	}
	c.waitVolumeInSync("vol1")
	if got := c.nodes["beta"].volumes()["vol1"].counters.resynced.Load(); got != 64<<10 {
		t.Fatalf("beta resynced %d bytes of vol1, want the 64 KiB written while it did not run it", got)
	}
	a = c.nodes["alpha"].volumes()["vol1"]
	eventually(t, func() bool { return a.status().Serving }, "alpha serves vol1 again")
	got := make([]byte, 3<<20)
	if err := a.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:1<<20], pattern(3, 1<<20)) || !bytes.Equal(got[2<<20:2<<20+64<<10], pattern(4, 64<<10)) {
		t.Fatal("vol1 came back without what was written to it")
	}
	requireSameData(t, next.Volumes[1])
	// Exported again under the same name.
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cl, err := nbdtest.Dial(dctx, c.nodes["alpha"].NBDAddr(), "vol1")
	if err != nil {
		t.Fatalf("vol1's export once added back: %v", err)
	}
	defer cl.Close()
	if b, err := cl.Read(2<<20, 64<<10); err != nil || !bytes.Equal(b, pattern(4, 64<<10)) {
		t.Fatalf("NBD read of vol1 added back: %v", err)
	}
}

// TestRemovingAPrimaryWithNBDClientsIsRefused: alpha's file drops vol1
// while an NBD client is connected to it on alpha, its primary. alpha
// refuses (ErrHasClients, naming the client), vol1 keeps running and
// serving, and status says so; once the client is gone, the next reload
// removes it.
func TestRemovingAPrimaryWithNBDClientsIsRefused(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	addedInSync(t, c, 4<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := nbdtest.Dial(ctx, c.nodes["alpha"].NBDAddr(), "vol1")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	local := cl.Conn.LocalAddr().String()

	ch := c.apply("alpha", c.cfg)
	if len(ch) != 1 || ch[0].Op != VolumeRemoved || !errors.Is(ch[0].Err, ErrHasClients) || !strings.Contains(ch[0].Err.Error(), local) {
		t.Fatalf("alpha applied %+v: want the removal refused, naming the client %s", ch, local)
	}
	if err := cl.Write(0, pattern(9, 4096), nbdtest.CmdFlagFUA); err != nil {
		t.Fatalf("vol1 stopped serving its client: %v", err)
	}
	st, _ := c.statusOf("beta", "vol1")
	w := hasWarning(st, transport.WarningConfigNotApplied, "vol1")
	if w == nil || w.Node != "alpha" || !strings.Contains(w.Detail, "keeps running it") || !strings.Contains(w.Detail, local) {
		t.Fatalf("status warns %+v: want config-not-applied on alpha naming the client", st.Warnings)
	}
	if _, err := cl.Disconnect(); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return len(c.nodes["alpha"].nbdClients("vol1")) == 0 }, "the client is gone")
	if ch := c.apply("alpha", c.cfg); len(ch) != 1 || ch[0].Err != nil {
		t.Fatalf("alpha's next reload: %+v", ch)
	}
	st, _ = c.statusOf("beta", "vol1")
	if hasWarning(st, transport.WarningConfigNotApplied, "vol1") != nil {
		t.Fatalf("status still warns: %+v", st.Warnings)
	}
	if w := hasWarning(st, transport.WarningConfigDiffers, "vol1"); w == nil || !strings.Contains(w.Text, "in the cluster file of beta but not in alpha's") {
		t.Fatalf("status warns %+v: want config-differs (beta still lists vol1)", st.Warnings)
	}
}

// TestAVolumeThatCannotBeAddedOnlineIsNamed: a volume whose disk here is a
// running volume's, or that names a node this node does not run with, is
// not added; the node says why (ErrVolumeConfig) and status shows it.
func TestAVolumeThatCannotBeAddedOnlineIsNamed(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	next := c.withVolume("vol1", 4<<20, "alpha")
	next.Volumes[1].Disks["alpha"] = c.cfg.Volumes[0].Disks["alpha"]
	ch := c.apply("alpha", next)
	if len(ch) != 1 || !errors.Is(ch[0].Err, ErrVolumeConfig) || !strings.Contains(ch[0].Err.Error(), "is the disk of vol0") {
		t.Fatalf("a disk of vol0 for vol1: %+v", ch)
	}
	st, _ := c.statusOf("alpha", "vol0")
	if w := hasWarning(st, transport.WarningConfigNotApplied, "vol1"); w == nil || w.Node != "alpha" || !strings.Contains(w.Detail, "could not add it") {
		t.Fatalf("status warns %+v: want config-not-applied on alpha", st.Warnings)
	}
	c.waitInSync() // vol0 untouched

	other := c.withVolume("vol2", 4<<20, "alpha")
	other.Nodes = append(slices.Clone(other.Nodes), NodeConfig{Name: "gamma", Control: freeAddr(t), Replication: freeAddr(t), NBD: freeAddr(t), StateDir: t.TempDir()})
	other.Volumes[1].Disks["gamma"] = SinglePath(filepath.Join(c.dir, "nowhere.img"))
	ch = c.apply("beta", other)
	if len(ch) != 1 || !errors.Is(ch[0].Err, ErrVolumeConfig) || !strings.Contains(ch[0].Err.Error(), "names node gamma") {
		t.Fatalf("a volume on a node beta does not run with: %+v", ch)
	}
}

// TestAVolumeAddedAtRuntimeGetsARaftEntryAndFailsOver: in a raft cluster
// with a witness, vol1 added on every node (the witness holds no disk of
// it) gets its entry in the state machine, alpha serves it under a lease,
// and when alpha dies the leader fails vol1 over to beta like vol0.
func TestAVolumeAddedAtRuntimeGetsARaftEntryAndFailsOver(t *testing.T) {
	const size = 4 << 20
	c := startRaftServing(t, size)
	next := c.withVolume("vol1", size, "alpha")
	if ch := c.apply("wit", next); !slices.Equal(ch, []VolumeChange{{Volume: "vol1", Op: VolumeAdded}}) {
		t.Fatalf("the witness applied %+v", ch)
	}
	for _, n := range []string{"alpha", "beta"} {
		if ch := c.apply(n, next); len(ch) != 1 || ch[0].Err != nil || !ch[0].Held {
			t.Fatalf("%s: %+v", n, ch)
		}
	}
	c.waitVolumeInSync("vol1")
	eventually(t, func() bool {
		va, ok := c.nodes["wit"].cl.c.Authority().Volume("vol1")
		return ok && va.Primary == "alpha" && va.IsUpToDate("beta")
	}, "raft knows vol1: primary alpha, beta UpToDate")
	ctx := context.Background()
	a := c.nodes["alpha"].volumes()["vol1"]
	eventually(t, func() bool { return a.WriteAt(ctx, pattern(6, 64<<10), 0, false) == nil }, "alpha serves vol1 under its lease")

	c.crash("alpha")
	b := c.nodes["beta"].volumes()["vol1"]
	eventually(t, func() bool { s := b.status(); return s.Role == "Primary" && s.Serving }, "beta takes vol1 over")
	got := make([]byte, 64<<10)
	if err := b.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, pattern(6, 64<<10)) {
		t.Fatalf("beta's vol1 lacks alpha's acknowledged write (%v)", err)
	}
}

// TestConfigDifferences pins how the nodes' files are compared: a volume
// every reachable file lists, or none, is no difference; one some list
// and others not names both sides; a node that keeps a volume its file
// dropped, or could not add one, is named with why; a node too old to say
// (nil) is left out.
func TestConfigDifferences(t *testing.T) {
	file := func(vols ...string) *transport.NodeConfigStatus { return &transport.NodeConfigStatus{Volumes: vols} }
	for _, tc := range []struct {
		name  string
		files map[string]*transport.NodeConfigStatus
		want  []transport.ConfigDifference
	}{
		{"the files agree", map[string]*transport.NodeConfigStatus{"alpha": file("vol0", "vol1"), "beta": file("vol0", "vol1")}, nil},
		{"a volume only alpha's file lists", map[string]*transport.NodeConfigStatus{"alpha": file("vol0", "vol1"), "beta": file("vol0"), "wit": file("vol0")},
			[]transport.ConfigDifference{{Volume: "vol1", In: []string{"alpha"}, NotIn: []string{"beta", "wit"}}}},
		{"an older node says nothing", map[string]*transport.NodeConfigStatus{"alpha": file("vol0", "vol1"), "beta": nil}, nil},
		{"alpha keeps a volume both files dropped", map[string]*transport.NodeConfigStatus{
			"alpha": {Volumes: []string{"vol0"}, Kept: map[string]string{"vol1": "1 NBD client"}}, "beta": file("vol0")},
			[]transport.ConfigDifference{{Volume: "vol1", NotApplied: map[string]string{"alpha": "keeps running it: 1 NBD client"}}}},
		{"beta could not add a volume both files list", map[string]*transport.NodeConfigStatus{
			"alpha": file("vol0", "vol1"), "beta": {Volumes: []string{"vol0", "vol1"}, NotAdded: map[string]string{"vol1": "no disk"}}},
			[]transport.ConfigDifference{{Volume: "vol1", NotApplied: map[string]string{"beta": "could not add it: no disk"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := configDifferences(tc.files)
			if !slices.EqualFunc(got, tc.want, func(a, b transport.ConfigDifference) bool {
				return sameDifference(a, b) && maps.Equal(a.NotApplied, b.NotApplied)
			}) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
