package replication

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// Authority is the cluster's state machine (the raft FSM's state): per
// volume, which node is primary at which epoch and which data nodes hold
// every acknowledged write. It is the only place that assigns an epoch.
//
// It is a value: Apply returns a new Authority and never changes the one
// it is called on, so a snapshot may keep one while later commands apply,
// and readers may share it. Apply is deterministic (raft replays it on
// every node) and the whole state encodes to JSON (raft snapshots).
type Authority struct {
	Volumes map[string]VolumeAuthority `json:"volumes,omitempty"`
	// Creates are the volumes created at run time, by name (created.go).
	Creates map[string]CreatedVolume `json:"created,omitempty"`
}

// VolumeAuthority is what the cluster decided for one volume. UpToDate and
// Outdated are sorted sets of data nodes; a data node is in at most one of
// them. A data node in neither is unknown: being synced, or never synced.
// Neither kind of node, nor a node outside DataNodes, may become primary
// without force.
type VolumeAuthority struct {
	Primary string `json:"primary"`
	// Epoch grows by one with every promotion; every replication message
	// carries it.
	Epoch     uint64   `json:"epoch"`
	DataNodes []string `json:"data_nodes,omitempty"`
	UpToDate  []string `json:"up_to_date,omitempty"`
	Outdated  []string `json:"outdated,omitempty"`
	// LastFailover is the last promotion that was a failover (no
	// handover from the old primary); nil when there was none. A
	// switchover keeps it.
	LastFailover *FailoverRecord `json:"last_failover,omitempty"`
	// MarkedSinceForce are the data nodes raft recorded Outdated or
	// UpToDate in a term an operator forced, since its promotion: the
	// forced primary's own word on each, which counts as any term's does
	// (OutdatedOnRecord), and, when the forced node was UpToDate on
	// record, the nodes the term before held Outdated on its word. Every
	// promotion clears it.
	MarkedSinceForce []string `json:"marked_since_force,omitempty"`
}

// FailoverRecord describes a failover: From was primary until To was
// promoted at Epoch. At and Reason come from the proposer (its clock and
// its words), so that Apply stays deterministic.
type FailoverRecord struct {
	From   string    `json:"from"`
	To     string    `json:"to"`
	Epoch  uint64    `json:"epoch"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
	// Forced: the operator forced it (replctl primary --force).
	Forced bool `json:"forced,omitempty"`
}

// AuthorityOp names an authority command.
type AuthorityOp string

// Authority commands. Each is described at its constructor.
const (
	OpInit         AuthorityOp = "init"
	OpMarkOutdated AuthorityOp = "mark-outdated"
	OpMarkUpToDate AuthorityOp = "mark-up-to-date"
	OpPromote      AuthorityOp = "promote"
	OpSetDataNodes AuthorityOp = "set-data-nodes"
)

// AuthorityCommand is one entry of the raft log: a tagged struct, the
// fields each Op reads are listed at its constructor. Epoch is the epoch
// the proposer saw (compare-and-set): a command whose Epoch is not the
// volume's fails with ErrStaleEpoch and changes nothing. Only init reads
// it as the epoch to start at, and set-data-nodes ignores it.
type AuthorityCommand struct {
	Op     AuthorityOp `json:"op"`
	Volume string      `json:"volume"`
	Node   string      `json:"node,omitempty"`
	Epoch  uint64      `json:"epoch"`
	Nodes  []string    `json:"nodes,omitempty"`
	Force  bool        `json:"force,omitempty"`
	// Failover, on a promote, says it is a failover: when and why (From,
	// To and Epoch are filled in by Apply).
	Failover *FailoverRecord `json:"failover,omitempty"`
	// Create, on a create-volume, is the volume's definition.
	Create *CreatedVolume `json:"create,omitempty"`
	// Size, on a grow-volume, is the volume's new size in bytes.
	Size uint64 `json:"size,omitempty"`
}

// InitCommand registers a volume the cluster does not know yet: primary
// at epoch, UpToDate; the other data nodes Outdated. For a volume the
// cluster knows, it changes nothing and returns the current state, so
// every node may propose it at start.
func InitCommand(volume, primary string, epoch uint64, dataNodes []string) AuthorityCommand {
	return AuthorityCommand{Op: OpInit, Volume: volume, Node: primary, Epoch: epoch, Nodes: dataNodes}
}

// MarkOutdatedCommand records that node misses writes the primary at epoch
// completed (or is about to complete) without it. Only the primary at
// that epoch should propose it; the node layer checks who proposes.
func MarkOutdatedCommand(volume string, epoch uint64, node string) AuthorityCommand {
	return AuthorityCommand{Op: OpMarkOutdated, Volume: volume, Node: node, Epoch: epoch}
}

// MarkUpToDateCommand records that node holds every write again (its
// resync from the primary at epoch finished).
func MarkUpToDateCommand(volume string, epoch uint64, node string) AuthorityCommand {
	return AuthorityCommand{Op: OpMarkUpToDate, Volume: volume, Node: node, Epoch: epoch}
}

// PromoteCommand makes node the primary at epoch+1. Without force the node
// must be UpToDate. With force any data node is promoted and becomes the
// only UpToDate one: every other data node is Outdated and resyncs from it.
// The old primary otherwise keeps its disk state; a new primary that
// completes a write without it marks it Outdated first, as for any peer.
func PromoteCommand(volume string, epoch uint64, node string, force bool) AuthorityCommand {
	return AuthorityCommand{Op: OpPromote, Volume: volume, Node: node, Epoch: epoch, Force: force}
}

// FailoverCommand is PromoteCommand for a promotion without a handover
// (the primary is lost, or the operator forces it): the volume records
// it as its LastFailover, at the proposer's time at, because of reason.
func FailoverCommand(volume string, epoch uint64, node string, force bool, at time.Time, reason string) AuthorityCommand {
	cmd := PromoteCommand(volume, epoch, node, force)
	cmd.Failover = &FailoverRecord{At: at, Reason: reason, Forced: force}
	return cmd
}

// SetDataNodesCommand replaces the volume's data nodes (runtime
// membership): a node that leaves is dropped from both sets, a node that
// joins starts Outdated. The primary cannot be removed.
func SetDataNodesCommand(volume string, nodes []string) AuthorityCommand {
	return AuthorityCommand{Op: OpSetDataNodes, Volume: volume, Nodes: nodes}
}

// Errors of Apply, checked with errors.Is. Each comes wrapped with the
// details.
var (
	// ErrStaleEpoch: the command was proposed for an epoch the volume is no
	// longer (or not yet) at.
	ErrStaleEpoch = errors.New("stale epoch")
	// ErrNotUpToDate: a promotion without force of a node that is Outdated
	// or unknown (it may miss acknowledged writes).
	ErrNotUpToDate = errors.New("not UpToDate")
	// ErrUnknownVolume: no init for this volume was applied.
	ErrUnknownVolume = errors.New("unknown volume")
	// ErrNotPrimary: the node is not the volume's primary at that epoch.
	ErrNotPrimary = errors.New("not primary")
	// ErrNotADataNode: the node holds no copy of the volume (a witness, a
	// removed node, a typo).
	ErrNotADataNode = errors.New("not a data node of the volume")
	// ErrRemovesPrimary: set-data-nodes without the current primary.
	ErrRemovesPrimary = errors.New("would remove the primary")
	// ErrBadCommand: a command no rule accepts (unknown op, empty names,
	// a promotion past the last epoch).
	ErrBadCommand = errors.New("malformed authority command")
	// ErrBadAuthority: a state (a raft snapshot) that breaks the
	// invariants Apply keeps (see Check).
	ErrBadAuthority = errors.New("authority state breaks its invariants")
)

// Volume returns the state of one volume.
func (a Authority) Volume(name string) (VolumeAuthority, bool) {
	va, ok := a.Volumes[name]
	return va, ok
}

// Check returns nil if a holds what Apply keeps true, else
// ErrBadAuthority naming what does not: every volume has a name, its
// data nodes are a sorted set of names, its primary is one of them, and
// UpToDate and Outdated are sorted sets of its data nodes that do not
// meet. A raft snapshot is checked before it replaces the state.
func (a Authority) Check() error {
	for name, cv := range a.Creates {
		if err := cv.check(); err != nil {
			return fmt.Errorf("%w: created volume %q: %v", ErrBadAuthority, name, err)
		}
		if cv.Name != name {
			return fmt.Errorf("%w: created volume %q is recorded as %q", ErrBadAuthority, name, cv.Name)
		}
	}
	for name, va := range a.Volumes {
		if name == "" {
			return fmt.Errorf("%w: a volume without a name", ErrBadAuthority)
		}
		for _, s := range []struct {
			what  string
			nodes []string
		}{{"data nodes", va.DataNodes}, {"UpToDate", va.UpToDate}, {"Outdated", va.Outdated}, {"marked since the force", va.MarkedSinceForce}} {
			for i, n := range s.nodes {
				if n == "" || i > 0 && n <= s.nodes[i-1] {
					return fmt.Errorf("%w: volume %q: %s %q are not a sorted set of names", ErrBadAuthority, name, s.what, s.nodes)
				}
				if !slices.Contains(va.DataNodes, n) {
					return fmt.Errorf("%w: volume %q: %s holds %s, not a data node", ErrBadAuthority, name, s.what, n)
				}
			}
		}
		if !slices.Contains(va.DataNodes, va.Primary) {
			return fmt.Errorf("%w: volume %q: primary %q is not a data node", ErrBadAuthority, name, va.Primary)
		}
		for _, n := range va.UpToDate {
			if va.IsOutdated(n) {
				return fmt.Errorf("%w: volume %q: %s is both UpToDate and Outdated", ErrBadAuthority, name, n)
			}
		}
	}
	return nil
}

// Clone returns a deep copy, for a caller that wants to change it.
func (a Authority) Clone() Authority {
	var c Authority
	if a.Volumes != nil {
		c.Volumes = make(map[string]VolumeAuthority, len(a.Volumes))
		for name, va := range a.Volumes {
			c.Volumes[name] = va.clone()
		}
	}
	if a.Creates != nil {
		c.Creates = make(map[string]CreatedVolume, len(a.Creates))
		for name, cv := range a.Creates {
			c.Creates[name] = cv.clone()
		}
	}
	return c
}

// Apply applies cmd. It returns the new Authority and the volume's new
// state, or, with an error, a itself and the volume's current state
// (useful to a proposer that lost a race: it learns the epoch).
func (a Authority) Apply(cmd AuthorityCommand) (Authority, VolumeAuthority, error) {
	if cmd.Volume == "" {
		return a, VolumeAuthority{}, fmt.Errorf("%w: %s without a volume", ErrBadCommand, cmd.Op)
	}
	if cmd.Op == OpCreateVolume || cmd.Op == OpDeleteVolume || cmd.Op == OpGrowVolume {
		return a.applyCreated(cmd)
	}
	cur, known := a.Volumes[cmd.Volume]
	if cmd.Op == OpInit && known {
		return a, cur.clone(), nil
	}
	if cmd.Op != OpInit && !known {
		return a, VolumeAuthority{}, fmt.Errorf("%w %q", ErrUnknownVolume, cmd.Volume)
	}
	var next VolumeAuthority
	var err error
	switch cmd.Op {
	case OpInit:
		next, err = initVolume(cmd)
	case OpMarkOutdated, OpMarkUpToDate:
		next, err = cur.mark(cmd)
	case OpPromote:
		next, err = cur.promote(cmd)
	case OpSetDataNodes:
		next, err = cur.setDataNodes(cmd)
	default:
		err = fmt.Errorf("%w: op %q", ErrBadCommand, cmd.Op)
	}
	if err != nil {
		return a, cur.clone(), fmt.Errorf("volume %q: %w", cmd.Volume, err)
	}
	out := Authority{Volumes: maps.Clone(a.Volumes), Creates: a.Creates}
	if out.Volumes == nil {
		out.Volumes = make(map[string]VolumeAuthority, 1)
	}
	out.Volumes[cmd.Volume] = next
	return out, next.clone(), nil
}

func initVolume(cmd AuthorityCommand) (VolumeAuthority, error) {
	nodes, err := nodeSet(cmd.Nodes)
	if err != nil {
		return VolumeAuthority{}, err
	}
	if !slices.Contains(nodes, cmd.Node) {
		return VolumeAuthority{}, fmt.Errorf("%w: primary %q is not among %s", ErrNotADataNode, cmd.Node, strings.Join(nodes, ", "))
	}
	return VolumeAuthority{
		Primary:   cmd.Node,
		Epoch:     cmd.Epoch,
		DataNodes: nodes,
		UpToDate:  []string{cmd.Node},
		Outdated:  without(nodes, cmd.Node),
	}, nil
}

func (va VolumeAuthority) mark(cmd AuthorityCommand) (VolumeAuthority, error) {
	if err := va.check(cmd); err != nil {
		return va, err
	}
	next := va.clone()
	if cmd.Op == OpMarkOutdated {
		next.UpToDate, next.Outdated = without(va.UpToDate, cmd.Node), with(va.Outdated, cmd.Node)
	} else {
		next.Outdated, next.UpToDate = without(va.Outdated, cmd.Node), with(va.UpToDate, cmd.Node)
	}
	if va.ForcedAt(va.Epoch) {
		next.MarkedSinceForce = with(va.MarkedSinceForce, cmd.Node)
	}
	return next, nil
}

func (va VolumeAuthority) promote(cmd AuthorityCommand) (VolumeAuthority, error) {
	if err := va.check(cmd); err != nil {
		return va, err
	}
	if va.Epoch == math.MaxUint64 {
		return va, fmt.Errorf("%w: epoch %d is the last one", ErrBadCommand, va.Epoch)
	}
	if !cmd.Force && !va.IsUpToDate(cmd.Node) {
		state := "unknown (being synced or never synced)"
		if va.IsOutdated(cmd.Node) {
			state = "Outdated"
		}
		return va, fmt.Errorf("%w: %s is %s; only force promotes it, and loses the writes it misses", ErrNotUpToDate, cmd.Node, state)
	}
	next := va.clone()
	next.Primary, next.Epoch, next.MarkedSinceForce = cmd.Node, va.Epoch+1, nil
	if cmd.Force {
		next.UpToDate, next.Outdated = []string{cmd.Node}, without(va.DataNodes, cmd.Node)
		if va.IsUpToDate(cmd.Node) {
			// The forced node held every write acknowledged on record
			// (a no-quorum force raft records once it has a quorum again:
			// the reclaim): a node the record held Outdated on its word
			// missed one it holds, which the new term's word keeps, so
			// that it is never pulled from (the simulation's seed 13758).
			for _, n := range va.Outdated {
				if n != cmd.Node && va.OutdatedOnRecord(n) {
					next.MarkedSinceForce = append(next.MarkedSinceForce, n)
				}
			}
		}
	}
	if f := cmd.Failover; f != nil && cmd.Node != va.Primary {
		next.LastFailover = &FailoverRecord{From: va.Primary, To: cmd.Node, Epoch: next.Epoch, At: f.At, Reason: f.Reason, Forced: cmd.Force}
	}
	return next, nil
}

func (va VolumeAuthority) setDataNodes(cmd AuthorityCommand) (VolumeAuthority, error) {
	nodes, err := nodeSet(cmd.Nodes)
	if err != nil {
		return va, err
	}
	if !slices.Contains(nodes, va.Primary) {
		return va, fmt.Errorf("%w %s", ErrRemovesPrimary, va.Primary)
	}
	next := va.clone()
	next.DataNodes, next.UpToDate, next.Outdated = nodes, nil, nil
	next.MarkedSinceForce = slices.DeleteFunc(next.MarkedSinceForce, func(n string) bool { return !slices.Contains(nodes, n) })
	if len(next.MarkedSinceForce) == 0 {
		next.MarkedSinceForce = nil
	}
	for _, n := range nodes {
		switch {
		case va.IsUpToDate(n):
			next.UpToDate = append(next.UpToDate, n)
		case va.IsOutdated(n) || !slices.Contains(va.DataNodes, n):
			next.Outdated = append(next.Outdated, n)
		}
	}
	return next, nil
}

// check applies the compare-and-set on the epoch and requires cmd.Node to
// be a data node.
func (va VolumeAuthority) check(cmd AuthorityCommand) error {
	if cmd.Epoch != va.Epoch {
		return fmt.Errorf("%w: %s proposed at epoch %d, the volume is at %d", ErrStaleEpoch, cmd.Op, cmd.Epoch, va.Epoch)
	}
	if !slices.Contains(va.DataNodes, cmd.Node) {
		return fmt.Errorf("%w: %q (data nodes: %s)", ErrNotADataNode, cmd.Node, strings.Join(va.DataNodes, ", "))
	}
	return nil
}

// CheckPrimary returns nil if node is the primary at epoch, else
// ErrStaleEpoch (the epoch moved on) or ErrNotPrimary.
func (va VolumeAuthority) CheckPrimary(node string, epoch uint64) error {
	if epoch != va.Epoch {
		return fmt.Errorf("%w: %s asks at epoch %d, the volume is at %d (primary %s)", ErrStaleEpoch, node, epoch, va.Epoch, va.Primary)
	}
	if node != va.Primary {
		return fmt.Errorf("%w: %s at epoch %d; the primary is %s", ErrNotPrimary, node, epoch, va.Primary)
	}
	return nil
}

// FailedOverAt reports whether the promotion at epoch was a failover (no
// handover from the old primary), as far as va knows: the last failover
// is of that epoch.
func (va VolumeAuthority) FailedOverAt(epoch uint64) bool {
	return va.LastFailover != nil && va.LastFailover.Epoch == epoch
}

// ForcedAt reports whether the promotion to epoch was an operator's
// forced one: the Outdated set it recorded is every other data node,
// whatever each holds (one may hold writes the forced primary lacks).
func (va VolumeAuthority) ForcedAt(epoch uint64) bool {
	return va.FailedOverAt(epoch) && va.LastFailover.Forced
}

// IsUpToDate reports whether the cluster counts node as holding every
// acknowledged write.
func (va VolumeAuthority) IsUpToDate(node string) bool {
	_, ok := slices.BinarySearch(va.UpToDate, node)
	return ok
}

// IsOutdated reports whether the cluster recorded that node misses writes.
func (va VolumeAuthority) IsOutdated(node string) bool {
	_, ok := slices.BinarySearch(va.Outdated, node)
	return ok
}

// OutdatedOnRecord reports whether raft holds node Outdated on the word
// of the current term: IsOutdated, but not by the promotion of a term an
// operator forced, which declared every other data node Outdated whatever
// each holds (one may hold the writes the forced primary lacks). The
// forced primary's own marks since (MarkedSinceForce: a write the node
// missed) count as any term's do.
func (va VolumeAuthority) OutdatedOnRecord(node string) bool {
	if !va.IsOutdated(node) {
		return false
	}
	if !va.ForcedAt(va.Epoch) {
		return true
	}
	_, ok := slices.BinarySearch(va.MarkedSinceForce, node)
	return ok
}

// OutdatedUnder reports whether raft's record says peer missed a write
// that primary, at epoch, holds, so that peer is never the source of a
// copy onto it: the record names primary at epoch and holds peer Outdated
// on its word (OutdatedOnRecord); or primary is ahead of the record (an
// operator forced it without a quorum, so raft knows nothing of its
// term), and the record's term, the last raft knows, held primary
// UpToDate (it took every write acknowledged in that term) and peer
// Outdated on its word (it missed one). Without the second, a node forced
// so took a peer that missed the last term's writes for newer whenever
// that peer's generations had moved on in an earlier term, and copied it
// over those writes (the simulation's seed 13758).
func (va VolumeAuthority) OutdatedUnder(primary string, epoch uint64, peer string) bool {
	switch {
	case va.Primary == primary && va.Epoch == epoch:
		return va.OutdatedOnRecord(peer)
	case va.Epoch < epoch:
		return va.IsUpToDate(primary) && va.OutdatedOnRecord(peer)
	}
	return false
}

// ChooseFailover is the rule for an automatic failover, once the caller
// has decided the primary is lost (its lease ran out): the first by name
// of the data nodes that are UpToDate, alive and not the primary. Without
// one it returns false and why, for status. dataNodes are the nodes the
// caller counts as data nodes now (a witness never is); alive is the
// caller's view (gossip).
func ChooseFailover(va VolumeAuthority, alive map[string]bool, dataNodes []string) (node string, ok bool, why FailoverRefusal) {
	why.Primary = va.Primary
	for _, n := range va.UpToDate { // sorted: the first alive one wins
		if n == va.Primary || !slices.Contains(dataNodes, n) {
			continue
		}
		if alive[n] {
			return n, true, FailoverRefusal{}
		}
		why.NotAlive = append(why.NotAlive, n)
	}
	for _, n := range va.Outdated {
		if n != va.Primary && alive[n] && slices.Contains(dataNodes, n) {
			why.OutdatedAlive = append(why.OutdatedAlive, n)
		}
	}
	return "", false, why
}

// FailoverRefusal is why ChooseFailover found no node to take over.
type FailoverRefusal struct {
	Primary string
	// NotAlive are the UpToDate data nodes besides the primary, none
	// alive; OutdatedAlive the alive data nodes raft has Outdated.
	NotAlive, OutdatedAlive []string
}

// String says it in words, for status ("" for the zero value: no
// refusal).
func (r FailoverRefusal) String() string {
	if r.Primary == "" && r.NotAlive == nil && r.OutdatedAlive == nil {
		return ""
	}
	var why string
	if len(r.NotAlive) == 0 {
		why = fmt.Sprintf("no UpToDate data node besides the primary %s", r.Primary)
	} else {
		why = fmt.Sprintf("no UpToDate node alive (%s not alive)", strings.Join(r.NotAlive, ", "))
	}
	if len(r.OutdatedAlive) > 0 {
		why += fmt.Sprintf("; %s alive but Outdated (only a forced promotion takes it)", strings.Join(r.OutdatedAlive, ", "))
	}
	return why
}

func (va VolumeAuthority) clone() VolumeAuthority {
	va.DataNodes = slices.Clone(va.DataNodes)
	va.UpToDate = slices.Clone(va.UpToDate)
	va.Outdated = slices.Clone(va.Outdated)
	va.MarkedSinceForce = slices.Clone(va.MarkedSinceForce)
	if va.LastFailover != nil {
		f := *va.LastFailover
		va.LastFailover = &f
	}
	return va
}

// nodeSet checks and sorts a list of node names, dropping repeats.
func nodeSet(nodes []string) ([]string, error) {
	if len(nodes) == 0 {
		return nil, fmt.Errorf("%w: no data nodes", ErrBadCommand)
	}
	if slices.Contains(nodes, "") {
		return nil, fmt.Errorf("%w: an empty node name", ErrBadCommand)
	}
	s := slices.Clone(nodes)
	slices.Sort(s)
	return slices.Compact(s), nil
}

// with returns the sorted set s plus n, as a new slice.
func with(s []string, n string) []string {
	i, found := slices.BinarySearch(s, n)
	if found {
		return slices.Clone(s)
	}
	return slices.Insert(slices.Clone(s), i, n)
}

// without returns the sorted set s minus n, as a new slice (nil if empty).
func without(s []string, n string) []string {
	var out []string
	for _, x := range s {
		if x != n {
			out = append(out, x)
		}
	}
	return out
}
