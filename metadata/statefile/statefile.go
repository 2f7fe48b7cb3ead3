package statefile

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/replvol/replvol/replication"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

var (
	bucketVolumes = []byte("volumes")
	bucketEvents  = []byte("events")
	bucketScrubs  = []byte("scrubs")
)

// maxEvents bounds the event history kept on disk.
const maxEvents = 1000

// VolumeState is what a node remembers about one volume across restarts.
type VolumeState struct {
	// Epoch is the highest primary epoch this node has agreed to.
	Epoch uint64 `json:"epoch"`
	// Primary is the node that holds Epoch ("" when unknown).
	Primary string `json:"primary"`
	// Generation identifies the data on this node's disk; zero when the disk
	// is Inconsistent (a resync was under way) or never synced.
	Generation replication.Generation `json:"generation"`
	// Clean is true only between a clean shutdown and the next start.
	Clean bool `json:"clean"`
	// Size of the volume when the state was created.
	Size int64 `json:"size"`
	// LocalStale: this node's disk was detached and missed writes that its
	// peers hold; it must be resynced before it holds the volume's data.
	LocalStale bool `json:"local_stale,omitempty"`
	// PrimarySince is when this node last became primary (unix ns).
	PrimarySince int64 `json:"primary_since,omitempty"`
	// PeerBitmaps holds, per peer, the generation its out-of-sync bitmap
	// (on disk, in the volume's metadata) starts from; absent while the
	// peer is in sync.
	PeerBitmaps map[string]replication.Generation `json:"peer_bitmaps,omitempty"`
	// SyncGeneration is, while Generation is zero because a resync into
	// this disk is under way, the generation the SyncSource's bitmap for
	// this node starts from (so an interrupted resync resumes).
	SyncGeneration replication.Generation `json:"sync_generation,omitempty"`
	// BootID is the operating system's boot the state was last written
	// in: a node that went down while applying replicated writes lost
	// its page cache only if the machine booted since.
	BootID string `json:"boot_id,omitempty"`
	// MDDeviceSize is, for internal metadata, the backing device size
	// the metadata is laid out for, whose end holds its superblock: a
	// disk that grew since (and was not resized onto yet) opens there.
	MDDeviceSize int64 `json:"md_device_size,omitempty"`
}

// ScrubState is a volume's scrub on this node (replctl scrub), kept so
// that a restart resumes a running or paused scrub at its checkpoint.
type ScrubState struct {
	// State is "running", "paused" or "" (idle).
	State string `json:"state,omitempty"`
	// Build: the scrub under way is the pass that builds the checksums
	// of a volume whose checksums were just turned on (every scrub stores
	// the sum of each block that has none; this one is shown as
	// "checksums: building").
	Build bool `json:"build,omitempty"`
	// Built are the blocks whose sums the scrub under way stored (they
	// had none).
	Built int64 `json:"built,omitempty"`
	// ChecksumsOff: the node ran the volume with checksums: off while
	// its metadata has a checksum area, so writes stored no sums and
	// those on disk may be stale: turning checksums on again drops them
	// all, then builds them.
	ChecksumsOff bool `json:"checksums_off,omitempty"`
	// Offset is the byte the scrub has checked up to (its checkpoint).
	Offset int64 `json:"offset,omitempty"`
	// Rate is the operator's rate (bytes per second; 0: the default).
	Rate int64 `json:"rate,omitempty"`
	// Checked, Repaired and Unrecoverable are the blocks the scrub under
	// way verified, repaired and found bad everywhere so far.
	Checked       int64 `json:"checked,omitempty"`
	Repaired      int64 `json:"repaired,omitempty"`
	Unrecoverable int64 `json:"unrecoverable,omitempty"`
	// LastFinished is when the last scrub ended (zero: never), with its
	// figures.
	LastFinished      time.Time `json:"last_finished,omitzero"`
	LastChecked       int64     `json:"last_checked,omitempty"`
	LastRepaired      int64     `json:"last_repaired,omitempty"`
	LastUnrecoverable int64     `json:"last_unrecoverable,omitempty"`
	// ScheduledSince is when this node first ran the volume with a
	// scrub_interval while it had never finished a scrub of it: the
	// first scheduled scrub is due an interval after it.
	ScheduledSince time.Time `json:"scheduled_since,omitzero"`
}

// Scrub is the volume's scrub as last put (ok false: none).
func (s *Store) Scrub(name string) (st ScrubState, ok bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketScrubs).Get([]byte(name))
		if b == nil {
			return nil
		}
		ok = true
		return json.Unmarshal(b, &st)
	})
	return st, ok, err
}

// PutScrub records the volume's scrub; durable BEFORE it returns.
func (s *Store) PutScrub(name string, st ScrubState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketScrubs).Put([]byte(name), b) })
}

// Event is one line of a node's history.
type Event struct {
	// Seq numbers the node's events (set by AddEvent).
	Seq     uint64    `json:"seq,omitempty"`
	Time    time.Time `json:"time"`
	Volume  string    `json:"volume,omitempty"`
	Kind    string    `json:"kind"`
	Message string    `json:"message"`
	// Peer, Old, New and Reason describe a state change, when the event
	// is one: the peer it concerns, the state before and after, and why.
	Peer   string `json:"peer,omitempty"`
	Old    string `json:"old,omitempty"`
	New    string `json:"new,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Offset and Length name the byte range an event is about (a block
	// repaired or found unrecoverable).
	Offset int64 `json:"offset,omitempty"`
	Length int64 `json:"length,omitempty"`
}

// Store is a node's state file.
type Store struct {
	db *bolt.DB
}

// ErrInUse: another process (another replnode on the same state
// directory) holds the file's lock.
var ErrInUse = errors.New("in use by another replnode")

// Open opens (creating if needed) the state file at path. It fails with
// ErrInUse, after 2 s, if another process holds the file.
func Open(path string) (*Store, error) {
	db, err := OpenBolt(path, "state file", 2*time.Second, bucketVolumes, bucketEvents, bucketScrubs)
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// OpenBolt opens (creating it and its directory if needed) the bbolt
// file at path, called what in errors, waiting at most timeout for its
// lock, and creates the buckets. A file it creates has its directory
// entry synced BEFORE it returns, so that what is committed to it cannot
// vanish with the entry in a crash.
func OpenBolt(path, what string, timeout time.Duration, buckets ...[]byte) (*bolt.DB, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	_, statErr := os.Stat(path)
	created := errors.Is(statErr, fs.ErrNotExist)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("%s %s is %w (stop it first): %w", what, path, ErrInUse, err)
		}
		return nil, fmt.Errorf("open %s %s: %w", what, path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range buckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && created {
		err = syncDir(dir)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init %s %s: %w", what, path, err)
	}
	return db, nil
}

// syncDir makes the entries of directory dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

// Volume returns the stored state of a volume; ok is false if there is none.
func (s *Store) Volume(name string) (st VolumeState, ok bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketVolumes).Get([]byte(name))
		if v == nil {
			return nil
		}
		ok = true
		return json.Unmarshal(v, &st)
	})
	if err != nil {
		return VolumeState{}, false, fmt.Errorf("read state of %s: %w", name, err)
	}
	return st, ok, nil
}

// PutVolume stores a volume's state durably (fsynced) before it returns.
func (s *Store) PutVolume(name string, st VolumeState) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketVolumes).Put([]byte(name), data)
	})
}

// DeleteVolume forgets a volume's state durably (fsynced) before it
// returns: a volume of that name created later starts afresh. A volume
// it has no state of is not an error.
func (s *Store) DeleteVolume(name string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketVolumes).Delete([]byte(name))
	})
}

// AddEvent appends to the event history, dropping the oldest beyond 1000;
// it returns the event as stored (with its Seq and Time).
func (s *Store) AddEvent(e Event) (Event, error) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEvents)
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		e.Seq = seq
		data, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if err := b.Put(binary.BigEndian.AppendUint64(nil, seq), data); err != nil {
			return err
		}
		if seq > maxEvents {
			c := b.Cursor()
			for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) <= seq-maxEvents; k, _ = c.Next() {
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return e, err
}

// Events returns up to the last n events, oldest first.
func (s *Store) Events(n int) ([]Event, error) {
	var out []Event
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketEvents).Cursor()
		for k, v := c.Last(); k != nil && len(out) < n; k, v = c.Prev() {
			var e Event
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			out = append(out, e)
		}
		return nil
	})
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, err
}
