package cluster

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/replication"
)

// fsm is raft's state machine: a replication.Authority, changed only by
// Apply (log entries: JSON-encoded replication.AuthorityCommand) and
// Restore. raft calls Apply, Snapshot and Restore from one goroutine;
// readers take the state under mu. The state is a value that Apply
// replaces and never changes, so a snapshot keeps it without copying.
type fsm struct {
	mu    lockorder.Mutex
	state replication.Authority
	// index is the raft index of the last entry Apply took (or of the
	// snapshot restored): the state is that of the log up to it. Not
	// raft's AppliedIndex, which runs ahead of the state machine.
	index   uint64
	applied func() // signals Changed; must not block
}

var _ raft.FSM = (*fsm)(nil)

// applyResult is what Apply returns to the leader's raft.ApplyFuture.
type applyResult struct {
	volume replication.VolumeAuthority
	err    error
}

func (f *fsm) Apply(l *raft.Log) any {
	var cmd replication.AuthorityCommand
	if err := json.Unmarshal(l.Data, &cmd); err != nil {
		f.mu.Lock()
		f.index = l.Index
		f.mu.Unlock()
		return applyResult{err: fmt.Errorf("%w: raft entry %d: %v", replication.ErrBadCommand, l.Index, err)}
	}
	if cmd.Create != nil {
		cmd.Create.Index = l.Index // the same on every node: it is the entry's
	}
	f.mu.Lock()
	next, va, err := f.state.Apply(cmd)
	f.state, f.index = next, l.Index
	f.mu.Unlock()
	f.applied()
	return applyResult{volume: va, err: err}
}

// authority returns the state; the caller must not change it.
func (f *fsm) authority() replication.Authority {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state
}

// authorityAt returns the state and the index of the entry it is as of;
// the caller must not change the state.
func (f *fsm) authorityAt() (replication.Authority, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state, f.index
}

func (f *fsm) volume(name string) (replication.VolumeAuthority, bool) {
	return f.authority().Volume(name)
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	a, index := f.authorityAt()
	return fsmSnapshot{Authority: a, Index: index}, nil
}

// Restore replaces the whole state with the snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var snap fsmSnapshot
	if err := json.NewDecoder(rc).Decode(&snap); err != nil {
		return fmt.Errorf("restore the authority snapshot: %w", err)
	}
	if err := snap.Authority.Check(); err != nil {
		return fmt.Errorf("restore the authority snapshot: %w", err)
	}
	f.mu.Lock()
	f.state, f.index = snap.Authority, snap.Index
	f.mu.Unlock()
	f.applied()
	return nil
}

// fsmSnapshot is the state as a snapshot holds it: the authority's JSON,
// with the index it is as of beside its fields (none in a snapshot of an
// earlier release: 0).
type fsmSnapshot struct {
	replication.Authority
	Index uint64 `json:"index,omitempty"`
}

// Persist writes the state as JSON; raft runs it concurrently with Apply.
func (s fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("write the authority snapshot: %w", err)
	}
	return sink.Close()
}

func (fsmSnapshot) Release() {}
