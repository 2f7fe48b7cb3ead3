package main

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/replvol/replvol/node"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/status"
)

// SIGHUP re-reads the config file. What can change online is applied: a
// volume added to the file is created and started, one removed from it
// is stopped with its disk and metadata kept (node.ApplyVolumes), and each
// remaining volume's protocol, on_congestion and resync_rate are changed
// through the node's own control API, as replctl adjust would. Every
// other difference from the config the node runs with is logged as
// needing a restart (and logged again on the next SIGHUP while it stays).
// A file that does not load is logged and ignored: the node keeps running
// as it was, and says so until a reload loads (node.Node.ReloadFailed:
// status, its warnings and --check, and an event).

// reloader holds the config the node runs with.
type reloader struct {
	path    string
	name    string
	control string // the node's own unix socket: no certificate needed
	log     *slog.Logger
	running *node.Config
	// volumes adds and removes the node's volumes (the node itself).
	volumes volumeApplier
	// report tells the node how each reload went (the node itself; nil:
	// only logged).
	report reloadReporter
}

// reloadReporter is the node's record of the last reload: a file that
// did not load (shown until one loads), or one that did.
type reloadReporter interface {
	ReloadFailed(file string, err error, now time.Time)
	Reloaded(file string)
}

// volumeApplier is the node's ApplyVolumes.
type volumeApplier interface {
	ApplyVolumes(next *node.Config) []node.VolumeChange
}

// fileChecker is the node's check of a new file against what raft
// records (node.Node.CheckFile).
type fileChecker interface {
	CheckFile(next *node.Config) error
}

// change is one difference between two configs, by its field's path in
// the file ("volumes[vol0].resync_rate").
type change struct {
	field    string
	old, new string
}

// onlineChange is what to apply online to a volume: op when the file
// added or removed it; else its protocol and congestion policy (the
// effective new values; "" when neither changed), and its resync rate
// when rateChanged.
type onlineChange struct {
	volume                       string
	op                           node.VolumeOp
	protocol, onCongestion       string
	oldProtocol, oldOnCongestion string
	// named is the file's on_congestion, or node.DefaultPolicy when it
	// names none (the policy then follows the protocol).
	named                     string
	rateChanged               bool
	resyncRate, oldResyncRate int64
}

// reload re-reads the file and applies it; it only logs.
func (r *reloader) reload(ctx context.Context) {
	r.log.Info("SIGHUP: re-reading the config", "config", r.path)
	cfg, err := node.LoadConfig(r.path)
	if err != nil {
		r.log.Error("SIGHUP: the config file does not load; nothing changed, the node runs on with the config it has", "config", r.path)
		for _, problem := range strings.Split(err.Error(), "\n") {
			r.log.Error("SIGHUP: config problem: " + problem)
		}
		r.failed(err)
		return
	}
	if _, ok := cfg.Node(r.name); !ok {
		r.log.Error("SIGHUP: the new config has no node "+r.name+"; nothing changed, the node runs on with the config it has", "config", r.path)
		r.failed(fmt.Errorf("%s: nodes: there is no node %s (this node): add it back, or stop replnode here", r.path, r.name))
		return
	}
	if c, ok := r.volumes.(fileChecker); ok {
		if err := c.CheckFile(cfg); err != nil {
			r.log.Error("SIGHUP: the config file names a volume created at run time; nothing changed, the node runs on with the config it has", "config", r.path, "err", err)
			r.failed(fmt.Errorf("%s: %w", r.path, err))
			return
		}
	}
	if r.report != nil {
		r.report.Reloaded(r.path)
	}
	online, restart := planReload(r.running, cfg, r.name)
	restart, sized := r.sizes(ctx, cfg, restart)
	for _, c := range restart {
		r.log.Warn(fmt.Sprintf("field %s changed: restart to apply", c.field), "old", c.old, "new", c.new)
	}
	// Always: it also clears what the node says of a volume it kept or
	// could not add, once the file no longer asks for it.
	r.applyVolumes(cfg)
	all := len(online)
	online = slices.DeleteFunc(online, func(oc onlineChange) bool { return oc.op != "" })
	if all == 0 && len(restart) == 0 && !sized {
		r.log.Info("SIGHUP: the config is unchanged")
		return
	}
	if len(online) == 0 {
		return
	}
	client, err := transport.DialControl(r.control)
	if err != nil {
		r.log.Error("SIGHUP: cannot reach the node's own control API", "addr", r.control, "err", err)
		return
	}
	defer client.Close()
	for _, oc := range online {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		req := &transport.AdjustRequest{Volume: oc.volume, Node: r.name, Protocol: oc.protocol, OnCongestion: oc.named}
		if oc.rateChanged {
			req.ResyncRate = &oc.resyncRate
		}
		_, err := client.Adjust(actx, req)
		cancel()
		if err != nil {
			r.log.Error("SIGHUP: could not apply the volume's new settings online", "volume", oc.volume,
				"protocol", oc.protocol, "on_congestion", oc.onCongestion, "resync_rate", oc.resyncRate, "err", status.Convert(err).Message())
			continue
		}
		r.log.Info("SIGHUP: applied online", "volume", oc.volume,
			"protocol", oc.oldProtocol+" -> "+oc.protocol, "on_congestion", oc.oldOnCongestion+" -> "+oc.onCongestion,
			"resync_rate", fmt.Sprintf("%d -> %d", oc.oldResyncRate, oc.resyncRate))
		for i := range r.running.Volumes {
			if v := &r.running.Volumes[i]; v.Name == oc.volume {
				nv := volumeNamed(cfg, oc.volume)
				if oc.protocol != "" {
					v.Protocol, v.OnCongestion = nv.Protocol, nv.OnCongestion
				}
				if oc.rateChanged {
					v.ResyncRate = nv.ResyncRate
				}
			}
		}
	}
}

// failed tells the node that the reload failed with err.
func (r *reloader) failed(err error) {
	if r.report != nil {
		r.report.ReloadFailed(r.path, err, time.Now())
	}
}

// applyVolumes makes the node run the volumes the file lists, and keeps
// what it did in r.running.
func (r *reloader) applyVolumes(cfg *node.Config) {
	if r.volumes == nil {
		return
	}
	for i, nc := range r.running.Nodes {
		if next, ok := cfg.Node(nc.Name); ok {
			r.running.Nodes[i].Pools = next.Pools // applied by ApplyVolumes
		}
	}
	for _, c := range r.volumes.ApplyVolumes(cfg) {
		where := "this node holds a disk of it"
		if !c.Held {
			where = "this node holds no disk of it"
		}
		switch {
		case c.Err != nil && c.Op == node.VolumeRemoved:
			r.log.Error("SIGHUP: volume not removed: it keeps running", "volume", c.Volume, "err", c.Err)
			continue
		case c.Err != nil:
			r.log.Error("SIGHUP: volume not added", "volume", c.Volume, "err", c.Err)
			continue
		case c.Op == node.VolumeAdded:
			r.log.Info("SIGHUP: volume added", "volume", c.Volume, "disk", where)
			r.running.Volumes = append(r.running.Volumes, *volumeNamed(cfg, c.Volume))
		case c.Op == node.VolumeRemoved:
			r.log.Info("SIGHUP: volume removed: stopped, its disk and metadata kept", "volume", c.Volume, "disk", where)
			r.running.Volumes = slices.DeleteFunc(r.running.Volumes, func(v node.VolumeConfig) bool { return v.Name == c.Volume })
		}
	}
}

// planReload compares the running config with the new one: what to
// apply online (the volumes added and removed, on every node; the
// settings of this node's volumes), and the differences that need a
// restart.
func planReload(running, next *node.Config, self string) ([]onlineChange, []change) {
	var online []onlineChange
	inBoth := map[string]bool{}
	for _, ov := range running.Volumes {
		if volumeNamed(next, ov.Name) == nil {
			online = append(online, onlineChange{volume: ov.Name, op: node.VolumeRemoved})
		}
	}
	for _, nv := range next.Volumes {
		ov := volumeNamed(running, nv.Name)
		if ov == nil {
			online = append(online, onlineChange{volume: nv.Name, op: node.VolumeAdded})
			continue
		}
		inBoth[nv.Name] = true
		_, heldNow := ov.Disks[self]
		_, heldNext := nv.Disks[self]
		if !heldNow || !heldNext {
			continue
		}
		op, oc := effective(*ov)
		np, nc := effective(nv)
		c := onlineChange{volume: nv.Name}
		if op != np || oc != nc {
			c.protocol, c.onCongestion, c.oldProtocol, c.oldOnCongestion = np, nc, op, oc
			if c.named = nv.OnCongestion; c.named == "" {
				c.named = node.DefaultPolicy
			}
		}
		if ov.ResyncRate != nv.ResyncRate {
			c.rateChanged, c.resyncRate, c.oldResyncRate = true, int64(nv.ResyncRate), int64(ov.ResyncRate)
		}
		if c.protocol != "" || c.rateChanged {
			online = append(online, c)
		}
	}
	var restart []change
	diffValues("", reflect.ValueOf(*running), reflect.ValueOf(*next), &restart)
	kept := restart[:0]
	for _, c := range restart {
		// A volume added or removed as a whole is applied online, and
		// so are a node's storage pools.
		onlineField := c.field == "volumes["+volumeOf(c.field)+"]" || isPoolsField(c.field)
		for v := range inBoth {
			switch c.field {
			case "volumes[" + v + "].protocol", "volumes[" + v + "].on_congestion", "volumes[" + v + "].resync_rate":
				onlineField = true
			}
		}
		if !onlineField {
			kept = append(kept, c)
		}
	}
	restart = kept
	// A node's metadata id is its position in nodes unless given: moving
	// it changes the id, which must never change.
	for _, n := range next.Nodes {
		if on, ok := running.Node(n.Name); ok && on.ID == n.ID && running.NodeID(n.Name) != next.NodeID(n.Name) {
			restart = append(restart, change{field: "nodes[" + n.Name + "] position (its metadata id)",
				old: fmt.Sprint(running.NodeID(n.Name)), new: fmt.Sprint(next.NodeID(n.Name))})
		}
	}
	return online, restart
}

// isPoolsField reports whether a field path is in a node's pools
// ("nodes[alpha].pools[0].dir").
func isPoolsField(field string) bool {
	rest, ok := strings.CutPrefix(field, "nodes[")
	if !ok {
		return false
	}
	_, after, ok := strings.Cut(rest, "].")
	return ok && (after == "pools" || strings.HasPrefix(after, "pools[") || strings.HasPrefix(after, "pools."))
}

// volumeOf is the volume a field path names ("volumes[vol0].size": vol0),
// or "".
func volumeOf(field string) string {
	rest, ok := strings.CutPrefix(field, "volumes[")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, "]")
	return name
}

// effective is the protocol and congestion policy a volume's config means.
func effective(v node.VolumeConfig) (protocol, onCongestion string) {
	protocol = v.ProtocolOrDefault()
	onCongestion = v.OnCongestion
	if onCongestion == "" {
		onCongestion = string(replication.DefaultOnCongestion(protocol))
	}
	return protocol, onCongestion
}

func volumeNamed(c *node.Config, name string) *node.VolumeConfig {
	for i := range c.Volumes {
		if c.Volumes[i].Name == name {
			return &c.Volumes[i]
		}
	}
	return nil
}

// diffValues appends the differences between a and b (of one type) to
// out, named by the config file's field paths. Lists of named entries
// (nodes, volumes, paths) are compared by name, not position.
func diffValues(path string, a, b reflect.Value, out *[]change) {
	switch a.Kind() {
	case reflect.Struct:
		for i := range a.NumField() {
			f := a.Type().Field(i)
			name := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if name == "-" {
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			diffValues(join(path, name), a.Field(i), b.Field(i), out)
		}
	case reflect.Slice:
		if named(a.Type().Elem()) {
			diffNamed(path, a, b, out)
			return
		}
		if sa, sb := leaf(a), leaf(b); sa != sb {
			*out = append(*out, change{field: path, old: sa, new: sb})
		}
	case reflect.Map:
		keys := map[string]reflect.Value{}
		for _, k := range append(a.MapKeys(), b.MapKeys()...) {
			keys[fmt.Sprint(k)] = k
		}
		for _, ks := range sortedKeys(keys) {
			k := keys[ks]
			va, vb := a.MapIndex(k), b.MapIndex(k)
			p := path + "[" + ks + "]"
			switch {
			case !va.IsValid():
				*out = append(*out, change{field: p, old: "(none)", new: "added"})
			case !vb.IsValid():
				*out = append(*out, change{field: p, old: "present", new: "removed"})
			default:
				diffValues(p, va, vb, out)
			}
		}
	default:
		if sa, sb := leaf(a), leaf(b); sa != sb {
			*out = append(*out, change{field: path, old: sa, new: sb})
		}
	}
}

// named reports whether t is a struct with a Name string field.
func named(t reflect.Type) bool {
	if t.Kind() != reflect.Struct {
		return false
	}
	f, ok := t.FieldByName("Name")
	return ok && f.Type.Kind() == reflect.String
}

func diffNamed(path string, a, b reflect.Value, out *[]change) {
	index := func(s reflect.Value) map[string]reflect.Value {
		m := map[string]reflect.Value{}
		for i := range s.Len() {
			m[s.Index(i).FieldByName("Name").String()] = s.Index(i)
		}
		return m
	}
	ia, ib := index(a), index(b)
	all := map[string]reflect.Value{}
	for k, v := range ia {
		all[k] = v
	}
	for k, v := range ib {
		all[k] = v
	}
	for _, name := range sortedKeys(all) {
		va, okA := ia[name]
		vb, okB := ib[name]
		p := path + "[" + name + "]"
		switch {
		case !okA:
			*out = append(*out, change{field: p, old: "(none)", new: "added"})
		case !okB:
			*out = append(*out, change{field: p, old: "present", new: "removed"})
		default:
			diffValues(p, va, vb, out)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

var (
	durationType = reflect.TypeFor[node.Duration]()
	sizeType     = reflect.TypeFor[node.ByteSize]()
	volSizeType  = reflect.TypeFor[node.VolumeSize]()
)

// leaf prints a value as the file would say it. It reads unexported
// fields too (reflect may read them, not hand them out).
func leaf(v reflect.Value) string {
	switch {
	case v.Type() == durationType:
		return time.Duration(v.Int()).String()
	case v.Type() == sizeType:
		return fmt.Sprint(v.Int())
	case v.Type() == volSizeType && node.VolumeSize(v.Int()) == node.SizeMax:
		return "max"
	}
	switch v.Kind() {
	case reflect.String:
		if v.String() == "" {
			return `""`
		}
		return v.String()
	case reflect.Bool:
		return fmt.Sprint(v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return fmt.Sprint(v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprint(v.Uint())
	case reflect.Float32, reflect.Float64:
		return fmt.Sprint(v.Float())
	case reflect.Slice, reflect.Array:
		parts := make([]string, v.Len())
		for i := range v.Len() {
			parts[i] = leaf(v.Index(i))
		}
		return "[" + strings.Join(parts, " ") + "]"
	case reflect.Struct:
		parts := make([]string, v.NumField())
		for i := range v.NumField() {
			parts[i] = leaf(v.Field(i))
		}
		return "{" + strings.Join(parts, " ") + "}"
	case reflect.Map:
		keys := map[string]reflect.Value{}
		for _, k := range v.MapKeys() {
			keys[fmt.Sprint(k)] = k
		}
		var parts []string
		for _, ks := range sortedKeys(keys) {
			parts = append(parts, ks+":"+leaf(v.MapIndex(keys[ks])))
		}
		return "{" + strings.Join(parts, " ") + "}"
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return "nil"
		}
		return leaf(v.Elem())
	}
	return v.Kind().String()
}
