package node

import (
	"errors"
	"fmt"
	"sort"

	"github.com/replvol/replvol/backing"
	"github.com/replvol/replvol/multipath"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// openDisk opens one node's backing LUN of a volume (backing.Open).
func (n *Node) openDisk(vc VolumeConfig, dc DiskConfig, preferred int, opts Options) (Disk, *multipath.Device, error) {
	size, err := n.requiredDiskSize(vc)
	if err != nil {
		return nil, nil, err
	}
	return backing.Open(vc, dc, size, backing.OpenOptions{
		Preferred: preferred, OpenDisk: opts.OpenDisk, OpenPath: opts.OpenPath, Log: n.log, Clock: n.clock,
	})
}

// balanceByGroup picks, for each of this node's multipath volumes whose
// paths have groups, the preferred path so that the active paths spread
// evenly over the groups (the seed's winning layout).
func balanceByGroup(cfg *Config, node string) map[string]int {
	var names []string
	var groups [][]string
	for _, vc := range cfg.Volumes {
		dc, ok := vc.Disks[node]
		if !ok || !dc.Multipath() || dc.Balance == "none" {
			continue
		}
		var g []string
		grouped := false
		for _, p := range dc.Paths {
			g = append(g, p.Group)
			grouped = grouped || p.Group != ""
		}
		if !grouped {
			continue
		}
		names = append(names, vc.Name)
		groups = append(groups, g)
	}
	out := map[string]int{}
	for i, pref := range multipath.BalanceByGroup(groups) {
		out[names[i]] = pref
	}
	return out
}

// pathStatus reports a volume's paths on this node.
func (v *Volume) pathStatus() []transport.PathStatus {
	if v.mp == nil {
		return nil
	}
	var out []transport.PathStatus
	for _, p := range v.mp.Paths() {
		out = append(out, transport.PathStatus{
			Node: v.self, Volume: v.name, Path: p.Name, State: p.State.String(), Group: p.Group,
			Preferred: p.Preferred, Reason: p.Reason, IOs: p.IOs, Bytes: p.Bytes, Errors: p.Errors,
			InFlight: p.InFlight, LatencyP50Micros: p.LatencyP50.Microseconds(), LatencyP99Micros: p.LatencyP99.Microseconds(),
			SinceChangeSeconds: p.SinceChange.Seconds(),
		})
	}
	return out
}

// pathAction runs an operator's path command (the control API's
// PathAction, on the node that owns the paths).
func (v *Volume) pathAction(r *transport.PathRequest) (*transport.PathReply, error) {
	n := v.node
	if v.mp == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%s on %s has a single-path disk; configure disks.%s.paths to use multipath", r.Volume, n.name, n.name)
	}
	var err error
	switch r.Action {
	case "fail":
		err = v.mp.Fail(r.Path)
	case "restore":
		err = v.mp.Restore(r.Path)
	case "rotate":
		v.mp.Rotate()
	case "policy":
		var p multipath.Policy
		if p, err = multipath.ParsePolicy(r.Policy); err == nil {
			err = v.mp.SetPolicy(p)
		}
	default:
		return nil, status.Errorf(codes.InvalidArgument, "unknown path action %q: want fail, restore, rotate or policy", r.Action)
	}
	if err != nil {
		if errors.Is(err, multipath.ErrUnknownPath) {
			var names []string
			for _, p := range v.mp.Paths() {
				names = append(names, p.Name)
			}
			sort.Strings(names)
			return nil, status.Errorf(codes.NotFound, "%s on %s has no path %q (paths: %v)", r.Volume, n.name, r.Path, names)
		}
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	n.event(r.Volume, "path-"+r.Action, fmt.Sprintf("operator: path %s %s %s on %s", r.Action, r.Path, r.Policy, n.name))
	return &transport.PathReply{Node: n.name, Policy: v.mp.Policy().String(), Paths: v.pathStatus()}, nil
}
