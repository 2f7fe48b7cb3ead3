package replication

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Volumes created at run time (replctl volume create, the CSI driver)
// are recorded in the Authority too, whole: the raft log carries their
// definitions, a snapshot keeps them, and every node derives the volumes
// it runs from its cluster file and these records.

// CreatedVolume is the definition of a volume created at run time.
type CreatedVolume struct {
	Name string `json:"name"`
	// Size is the volume's size in bytes, a multiple of 4 KiB.
	Size uint64 `json:"size"`
	// Pool is the storage pool every replica's backing file is in.
	Pool     string `json:"pool"`
	Protocol string `json:"protocol"`
	// Nodes are the nodes that hold a replica, in the order they were
	// chosen: the first one is the primary at creation.
	Nodes []string `json:"nodes"`
	// Index is the raft log index of the create (set by the state
	// machine as it applies it): it tells one volume of a name from an
	// earlier one that was deleted.
	Index uint64 `json:"index,omitempty"`
	// RequestID is the ID the caller chose once for its create
	// (transport.VolumeCreateRequest.RequestID; "" in a record of a
	// version without it, or a caller that gave none). A create asked
	// again under the same ID, after a leader change cut off its answer,
	// finds its own record by it and answers as the first would have.
	RequestID string `json:"request_id,omitempty"`
}

// Same reports whether c and o define the same volume (wherever in the
// log each was recorded, whichever request asked for it).
func (c CreatedVolume) Same(o CreatedVolume) bool {
	return c.Name == o.Name && c.Size == o.Size && c.Pool == o.Pool && c.Protocol == o.Protocol && slices.Equal(c.Nodes, o.Nodes)
}

// check says what makes the definition one no rule accepts, or nil.
func (c CreatedVolume) check() error {
	switch {
	case c.Name == "":
		return errors.New("a volume without a name")
	case c.Size == 0 || c.Size%4096 != 0:
		return fmt.Errorf("volume %q: size %d is not a positive multiple of 4096", c.Name, c.Size)
	case c.Pool == "":
		return fmt.Errorf("volume %q: no pool", c.Name)
	case c.Protocol != "A" && c.Protocol != "B" && c.Protocol != "C":
		return fmt.Errorf("volume %q: protocol %q", c.Name, c.Protocol)
	case len(c.Nodes) == 0:
		return fmt.Errorf("volume %q: no nodes", c.Name)
	}
	seen := map[string]bool{}
	for _, n := range c.Nodes {
		if n == "" || seen[n] {
			return fmt.Errorf("volume %q: nodes %q are not distinct names", c.Name, c.Nodes)
		}
		seen[n] = true
	}
	return nil
}

func (c CreatedVolume) clone() CreatedVolume {
	c.Nodes = slices.Clone(c.Nodes)
	return c
}

// Authority commands of the volumes created at run time.
const (
	OpCreateVolume AuthorityOp = "create-volume"
	OpDeleteVolume AuthorityOp = "delete-volume"
	OpGrowVolume   AuthorityOp = "grow-volume"
)

// ErrVolumeExists: a create of a name the cluster already gives another
// definition.
var ErrVolumeExists = errors.New("a volume of that name exists")

// CreateVolumeCommand records a volume created at run time. A volume of
// that name with the same definition and the same RequestID changes
// nothing (a retry); another definition, or the same one under another
// RequestID (another caller's create, which did not make the volume),
// fails with ErrVolumeExists and changes nothing either.
func CreateVolumeCommand(def CreatedVolume) AuthorityCommand {
	d := def.clone()
	return AuthorityCommand{Op: OpCreateVolume, Volume: def.Name, Create: &d}
}

// DeleteVolumeCommand forgets a volume created at run time: its
// definition and its authority (primary, epoch, UpToDate). A name not
// created at run time changes nothing.
func DeleteVolumeCommand(name string) AuthorityCommand {
	return AuthorityCommand{Op: OpDeleteVolume, Volume: name}
}

// GrowVolumeCommand records that a volume created at run time grew to
// size bytes (replctl resize): a node that opens it later sizes its file
// and runs it at that size. A size no larger than the recorded one, or a
// name not created at run time, changes nothing.
func GrowVolumeCommand(name string, size uint64) AuthorityCommand {
	return AuthorityCommand{Op: OpGrowVolume, Volume: name, Size: size}
}

// Created returns the definition of a volume created at run time.
func (a Authority) Created(name string) (CreatedVolume, bool) {
	c, ok := a.Creates[name]
	if !ok {
		return CreatedVolume{}, false
	}
	return c.clone(), true
}

// applyCreated applies a create, a grow or a delete. Like Apply, it
// returns the volume's state as the result holds it: none once deleted,
// and the current one when the command changed nothing (a delete or grow
// of a volume not created at run time, a create asked again), which a
// volume of the cluster file, or a created one since initialised, has.
func (a Authority) applyCreated(cmd AuthorityCommand) (Authority, VolumeAuthority, error) {
	out, err := a.applyCreatedOnly(cmd)
	va, _ := out.Volume(cmd.Volume)
	return out, va.clone(), err
}

// applyCreatedOnly is applyCreated's change of the Authority.
func (a Authority) applyCreatedOnly(cmd AuthorityCommand) (Authority, error) {
	cur, known := a.Creates[cmd.Volume]
	switch cmd.Op {
	case OpCreateVolume:
		if cmd.Create == nil || cmd.Create.Name != cmd.Volume {
			return a, fmt.Errorf("%w: create-volume %q without its definition", ErrBadCommand, cmd.Volume)
		}
		if err := cmd.Create.check(); err != nil {
			return a, fmt.Errorf("%w: %v", ErrBadCommand, err)
		}
		if known {
			if cur.Same(*cmd.Create) && cur.RequestID == cmd.Create.RequestID {
				return a, nil
			}
			// The same definition under another ID is refused too, so that
			// its proposer does not say it made the volume: the state is
			// unchanged either way, so a node of a version that ignores the
			// ID and takes the create as a retry agrees with this one.
			return a, fmt.Errorf("%w: %s is %s", ErrVolumeExists, cmd.Volume, cur.Describe())
		}
		if _, has := a.Volumes[cmd.Volume]; has {
			return a, fmt.Errorf("%w: %s is a volume of the cluster file", ErrVolumeExists, cmd.Volume)
		}
		out := a.shallow()
		out.Creates[cmd.Volume] = cmd.Create.clone()
		return out, nil
	case OpGrowVolume:
		if !known || cmd.Size <= cur.Size {
			return a, nil
		}
		if cmd.Size%4096 != 0 {
			return a, fmt.Errorf("%w: grow-volume %q to %d bytes, not a multiple of 4 KiB", ErrBadCommand, cmd.Volume, cmd.Size)
		}
		out := a.shallow()
		grown := cur.clone()
		grown.Size = cmd.Size
		out.Creates[cmd.Volume] = grown
		return out, nil
	case OpDeleteVolume:
		if !known {
			return a, nil
		}
		out := a.shallow()
		delete(out.Creates, cmd.Volume)
		delete(out.Volumes, cmd.Volume)
		return out, nil
	}
	return a, fmt.Errorf("%w: op %q", ErrBadCommand, cmd.Op)
}

// shallow copies a's maps (not their values, which Apply never changes).
func (a Authority) shallow() Authority {
	out := Authority{Volumes: maps.Clone(a.Volumes), Creates: maps.Clone(a.Creates)}
	if out.Volumes == nil {
		out.Volumes = map[string]VolumeAuthority{}
	}
	if out.Creates == nil {
		out.Creates = map[string]CreatedVolume{}
	}
	return out
}

// Describe says the definition in words: "64MiB in pool default on
// alpha, beta, protocol C".
func (c CreatedVolume) Describe() string {
	return fmt.Sprintf("%d bytes in pool %s on %s, protocol %s", c.Size, c.Pool, strings.Join(c.Nodes, ", "), c.Protocol)
}
