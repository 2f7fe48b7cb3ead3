package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/hashicorp/raft"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/metadata/statefile"
	bolt "go.etcd.io/bbolt"
)

// castagnoli is the CRC-32C table of the entries' checksums.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// RaftStore is the cluster's raft log (raft.LogStore) and stable state
// (raft.StableStore: current term, last vote) on one bbolt file of its own,
// raft.db in the node's state directory. raft-boltdb is not used: its v2
// does not build with our raft and memberlist (research/libraries.md §0.1).
//
// Durability: raft relies on StoreLog, StoreLogs, DeleteRange, Set and
// SetUint64 being on stable storage BEFORE they return (a vote or a log
// entry acknowledged and then lost breaks raft's safety). Each is one bbolt
// transaction, committed with fsync (NoSync stays false); StoreLogs writes
// all its entries in one transaction, so a crash keeps all or none.
//
// It is safe for concurrent use: raft reads entries from its replication
// goroutines while the leader appends.
type RaftStore struct {
	db *bolt.DB
}

var (
	_ raft.LogStore    = (*RaftStore)(nil)
	_ raft.StableStore = (*RaftStore)(nil)
)

var (
	// bucketRaftLogs maps a log index (8 bytes, big-endian, so that
	// the cursor order is the index order) to an encoded raft.Log.
	bucketRaftLogs = []byte("raft-logs")
	// bucketRaftStable holds the StableStore keys; SetUint64 stores
	// 8 bytes, big-endian.
	bucketRaftStable = []byte("raft-stable")
)

// ErrKeyNotFound is what Get and GetUint64 return for a key never set. Its
// text is exactly "not found" and it is never wrapped: raft v1.8.0 does
// not use errors.Is but compares err.Error() with "not found" (api.go:478
// in HasExistingState, api.go:519 in NewRaft, raft.go:1710 and :1715 in
// requestVote), and takes any other error as a failed read (NewRaft
// refuses to start). The StableStore comment (stable.go) says a missing
// key gives an empty value or 0; raft-boltdb and raft's InmemStore.Get
// return this same error instead, and raft accepts both.
var ErrKeyNotFound = errors.New("not found")

// raftStoreOpenTimeout bounds the wait for the file lock: a second
// opener (another replnode on the same state directory) fails with
// statefile.ErrInUse instead of hanging.
const raftStoreOpenTimeout = 2 * time.Second

// OpenRaftStore opens (creating if needed) the raft store at path. It
// fails with statefile.ErrInUse, after 2 s, if another process holds the file.
func OpenRaftStore(path string) (*RaftStore, error) {
	return openRaftStore(path, raftStoreOpenTimeout)
}

func openRaftStore(path string, timeout time.Duration) (*RaftStore, error) {
	db, err := statefile.OpenBolt(path, "raft store", timeout, bucketRaftLogs, bucketRaftStable)
	if err != nil {
		return nil, err
	}
	return &RaftStore{db: db}, nil
}

// Close closes the file. Shut raft down (Shutdown().Error()) first.
func (s *RaftStore) Close() error { return s.db.Close() }

func indexKey(i uint64) []byte { return binary.BigEndian.AppendUint64(nil, i) }

// FirstIndex returns the lowest index stored, 0 when the log is empty.
func (s *RaftStore) FirstIndex() (uint64, error) {
	return s.edgeIndex(func(c *bolt.Cursor) []byte { k, _ := c.First(); return k })
}

// LastIndex returns the highest index stored, 0 when the log is empty.
func (s *RaftStore) LastIndex() (uint64, error) {
	return s.edgeIndex(func(c *bolt.Cursor) []byte { k, _ := c.Last(); return k })
}

func (s *RaftStore) edgeIndex(seek func(*bolt.Cursor) []byte) (uint64, error) {
	var i uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if k := seek(tx.Bucket(bucketRaftLogs).Cursor()); k != nil {
			i = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return i, err
}

// GetLog reads the entry at index into log. A missing index returns
// raft.ErrLogNotFound itself, unwrapped: raft compares with == (v1.8.0
// replication.go:223, where it falls back to sending a snapshot).
func (s *RaftStore) GetLog(index uint64, log *raft.Log) error {
	return s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketRaftLogs).Get(indexKey(index))
		if v == nil {
			return raft.ErrLogNotFound
		}
		return decodeRaftLog(index, v, log) // copies out of the mmap
	})
}

// StoreLog stores one entry, durably BEFORE it returns.
func (s *RaftStore) StoreLog(log *raft.Log) error { return s.StoreLogs([]*raft.Log{log}) }

// StoreLogs stores the entries in one transaction, durably BEFORE it
// returns. An entry at an index already stored replaces it (raft
// overwrites a follower's conflicting suffix after DeleteRange, but does
// not rely on that order).
func (s *RaftStore) StoreLogs(logs []*raft.Log) error {
	vals := make([][]byte, len(logs))
	for i, l := range logs {
		v, err := encodeRaftLog(l)
		if err != nil {
			return err
		}
		vals[i] = v
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRaftLogs)
		for i, l := range logs {
			if err := b.Put(indexKey(l.Index), vals[i]); err != nil {
				return fmt.Errorf("store raft log %d: %w", l.Index, err)
			}
		}
		return nil
	})
}

// DeleteRange deletes the entries from first to last, both included,
// durably BEFORE it returns.
func (s *RaftStore) DeleteRange(first, last uint64) error {
	if first > last {
		return nil
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketRaftLogs).Cursor()
		from := indexKey(first)
		// Seek again after each Delete: a bbolt cursor's Next after
		// Delete skips the following key when the page is already
		// materialised in this transaction.
		for k, _ := c.Seek(from); k != nil && binary.BigEndian.Uint64(k) <= last; k, _ = c.Seek(from) {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}

// Set stores val under key, durably BEFORE it returns.
func (s *RaftStore) Set(key, val []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRaftStable).Put(key, val)
	})
}

// Get returns a copy of the value under key, or ErrKeyNotFound.
func (s *RaftStore) Get(key []byte) ([]byte, error) {
	var val []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketRaftStable).Get(key)
		if v == nil {
			return ErrKeyNotFound
		}
		val = append([]byte{}, v...)
		return nil
	})
	return val, err
}

// SetUint64 stores val under key, durably BEFORE it returns.
func (s *RaftStore) SetUint64(key []byte, val uint64) error {
	return s.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

// GetUint64 returns the value SetUint64 stored under key, or 0 and
// ErrKeyNotFound.
func (s *RaftStore) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: raft stable key %q holds %d bytes, not a uint64", metadata.ErrCorrupt, key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// Encoding of one raft.Log (little-endian, like the volume metadata):
//
//	 0 1  encoding version (1); a higher one is refused (metadata.ErrNewerFormat)
//	 1 1  Type (raft.LogType)
//	 2 1  flags: 1 Data is not nil, 2 Extensions is not nil
//	 3 1  zero
//	 4 8  Index (the key repeats it; they must agree)
//	12 8  Term
//	20 8  AppendedAt, seconds since 1970-01-01 UTC (signed)
//	28 4  AppendedAt, nanoseconds within the second
//	32 4  len(Data), 36 4 len(Extensions)
//	40 …  Data, then Extensions
//	 …  4 CRC32C of everything before it
//
// AppendedAt comes back in UTC, without a monotonic reading; the zero time
// comes back as the zero time.
const (
	raftLogVersion    = 1
	raftLogHeaderSize = 40
	raftLogHasData    = 1
	raftLogHasExt     = 2
	// maxRaftLogPayload keeps Data and Extensions together under bbolt's
	// value limit, with room for the header.
	maxRaftLogPayload = bolt.MaxValueSize - raftLogHeaderSize - 4
)

// encodeRaftLog renders l for the store.
func encodeRaftLog(l *raft.Log) ([]byte, error) {
	if int64(len(l.Data))+int64(len(l.Extensions)) > maxRaftLogPayload {
		return nil, fmt.Errorf("raft log %d: %d bytes of data and %d of extensions exceed %d",
			l.Index, len(l.Data), len(l.Extensions), maxRaftLogPayload)
	}
	le := binary.LittleEndian
	b := make([]byte, raftLogHeaderSize, raftLogHeaderSize+len(l.Data)+len(l.Extensions)+4)
	b[0], b[1] = raftLogVersion, byte(l.Type)
	if l.Data != nil {
		b[2] |= raftLogHasData
	}
	if l.Extensions != nil {
		b[2] |= raftLogHasExt
	}
	le.PutUint64(b[4:], l.Index)
	le.PutUint64(b[12:], l.Term)
	le.PutUint64(b[20:], uint64(l.AppendedAt.Unix()))
	le.PutUint32(b[28:], uint32(l.AppendedAt.Nanosecond()))
	le.PutUint32(b[32:], uint32(len(l.Data)))
	le.PutUint32(b[36:], uint32(len(l.Extensions)))
	b = append(append(b, l.Data...), l.Extensions...)
	return le.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// decodeRaftLog parses the entry stored under index into l, copying Data
// and Extensions out of v. It returns metadata.ErrCorrupt (wrapped) for a value
// that is not a whole, checksummed entry of that index, and metadata.ErrNewerFormat
// for a newer encoding.
func decodeRaftLog(index uint64, v []byte, l *raft.Log) error {
	le := binary.LittleEndian
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w: raft log %d: "+format, append([]any{metadata.ErrCorrupt, index}, args...)...)
	}
	if len(v) < raftLogHeaderSize+4 {
		return corrupt("%d bytes", len(v))
	}
	if v[0] > raftLogVersion {
		return fmt.Errorf("%w: raft log %d: encoding %d, this build reads up to %d; upgrade replvol", metadata.ErrNewerFormat, index, v[0], raftLogVersion)
	}
	body := v[:len(v)-4]
	if got, want := crc32.Checksum(body, castagnoli), le.Uint32(v[len(body):]); got != want {
		return corrupt("checksum %08x, want %08x", got, want)
	}
	dataLen, extLen := int64(le.Uint32(v[32:])), int64(le.Uint32(v[36:]))
	flags := v[2]
	switch {
	case v[0] == 0 || flags&^(raftLogHasData|raftLogHasExt) != 0 || v[3] != 0 ||
		(flags&raftLogHasData == 0 && dataLen > 0) || (flags&raftLogHasExt == 0 && extLen > 0):
		return corrupt("encoding %d, flags %#x, %d bytes of data, %d of extensions", v[0], flags, dataLen, extLen)
	case raftLogHeaderSize+dataLen+extLen != int64(len(body)):
		return corrupt("%d bytes of data and %d of extensions in a %d-byte entry", dataLen, extLen, len(v))
	case le.Uint64(v[4:]) != index:
		return corrupt("holds index %d", le.Uint64(v[4:]))
	}
	nanos := le.Uint32(v[28:])
	if nanos >= 1e9 {
		return corrupt("%d nanoseconds", nanos)
	}
	data := v[raftLogHeaderSize : raftLogHeaderSize+dataLen]
	ext := v[raftLogHeaderSize+dataLen : len(body)]
	*l = raft.Log{
		Index:      index,
		Term:       le.Uint64(v[12:]),
		Type:       raft.LogType(v[1]),
		Data:       cloneIf(flags&raftLogHasData != 0, data),
		Extensions: cloneIf(flags&raftLogHasExt != 0, ext),
		AppendedAt: time.Unix(int64(le.Uint64(v[20:])), int64(nanos)).UTC(),
	}
	return nil
}

// cloneIf returns a copy of b (non-nil even when empty) if present, else
// nil.
func cloneIf(present bool, b []byte) []byte {
	if !present {
		return nil
	}
	return append([]byte{}, b...)
}
