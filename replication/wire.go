package replication

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc64"
	"math"
)

// The replication stream carries frames. The primary opens a stream with a
// Hello; the secondary answers with a HelloReply, then the primary sends
// Batches of entries and the secondary answers each Batch with an Ack for
// its last sequence number, after applying every entry in order.

// FrameType is the first byte of every frame.
type FrameType uint8

// Frame types.
const (
	FrameHello      FrameType = 1 // JSON Hello
	FrameHelloReply FrameType = 2 // JSON HelloReply
	FrameBatch      FrameType = 3 // binary entries
	FrameAck        FrameType = 4 // binary ack
	FrameReadReply  FrameType = 5 // binary: the data of one OpRead
)

// Op is what one batch entry asks the secondary to do.
type Op uint8

// Entry operations.
const (
	OpWrite      Op = 1 // write Data at Off
	OpZero       Op = 2 // write Length zero bytes at Off
	OpTrim       Op = 3 // discard Length bytes at Off (reads return zeroes)
	OpFlush      Op = 4 // make every earlier entry durable
	OpResyncData Op = 5 // resync: Data is the primary's content at Off
	OpResyncZero Op = 6 // resync: the primary's content at Off is Length zeroes
	OpSyncStart  Op = 7 // resync begins: Data is the primary's generation; the peer is Inconsistent from here
	OpSyncDone   Op = 8 // resync ended: Data is the primary's generation; the peer is UpToDate after this entry
	// OpRead asks for Length bytes at Off: the secondary answers with a
	// FrameReadReply BEFORE the ack of the batch. A primary whose own disk
	// is detached reads through it.
	OpRead Op = 9
	// OpVerify carries the primary's checksums (BlockChecksum, 8 bytes per
	// 4 KiB block) of [Off, Off+Length): the secondary compares its own
	// blocks and answers with a FrameReadReply listing the differing ones
	// (EncodeMismatches), BEFORE the ack of the batch. Online verify.
	OpVerify Op = 10
	// OpResyncLost says that the resync source holds [Off, Off+Length)
	// (whole blocks) bad and that no replica it reached holds it good:
	// the target records the range as unrecoverable, as the source did
	// (reads of it fail with EIO, never its older data), until a write
	// covers it. The source leaves the range marked for the target. No
	// payload; a source sends it only to a peer whose HelloReply says
	// Lost.
	OpResyncLost Op = 11
)

// EntryFUA asks that the entry be durable before it is acknowledged.
const EntryFUA uint8 = 1

// EntrySums says that the entry's Sums, 4 bytes each (big-endian), one
// per 4 KiB block of its payload, lie between its header and its payload
// (a primary sends them only to a peer whose HelloReply says Sums).
// AppendEntryHeader sets it when the entry has Sums.
const EntrySums uint8 = 2

// Entry is one operation in a batch.
type Entry struct {
	Op     Op
	Flags  uint8
	Seq    uint64
	Off    int64
	Length int64  // bytes covered; for data ops len(Data)
	Data   []byte // payload for OpWrite, OpResyncData, OpSyncStart, OpSyncDone
	// Sums are the checksums at rest (internal/blocksum) of the 4 KiB
	// blocks of Data, one per block from Off on, for an OpWrite or
	// OpResyncData whose range is whole blocks (nil otherwise, or when
	// the volume keeps none).
	Sums []uint32
}

// CarriesSums reports whether op carries the checksums of its payload's
// blocks on the wire, when it has them (Entry.Sums).
func (op Op) CarriesSums() bool { return op == OpWrite || op == OpResyncData }

// sumsOnWire is the number of sums e carries on the wire.
func (e *Entry) sumsOnWire() int {
	if !e.Op.CarriesSums() {
		return 0
	}
	return len(e.Sums)
}

// HasPayload reports whether op carries Data on the wire.
func (op Op) HasPayload() bool {
	switch op {
	case OpWrite, OpResyncData, OpSyncStart, OpSyncDone, OpVerify:
		return true
	}
	return false
}

func (op Op) valid() bool { return op >= OpWrite && op <= OpResyncLost }

const entryHeaderLen = 1 + 1 + 2 + 4 + 8 + 8 // op, flags, pad, length, seq, off

// MaxEntryLength bounds one entry's length (the NBD maximum request size).
const MaxEntryLength = 32 << 20

// EncodedLen returns the bytes e takes in a batch frame.
func (e *Entry) EncodedLen() int {
	n := entryHeaderLen + SumLen*e.sumsOnWire()
	if e.Op.HasPayload() {
		n += len(e.Data)
	}
	return n
}

// SumLen is the bytes one block's checksum takes on the wire.
const SumLen = 4

// BatchHeaderLen is the size of a batch frame before its entries.
const BatchHeaderLen = 1 + 4

// batchReceipt, in a batch header's count, asks the secondary to
// acknowledge the batch as soon as it received it (AckReceived), before it
// applies it: protocol B.
const batchReceipt = 1 << 31

// AppendBatchHeader starts a batch frame of count entries.
func AppendBatchHeader(dst []byte, count int) []byte {
	return AppendBatchHeaderReceipt(dst, count, false)
}

// AppendBatchHeaderReceipt starts a batch frame of count entries that, with
// receipt, the secondary acknowledges on receipt too (AckReceived).
func AppendBatchHeaderReceipt(dst []byte, count int, receipt bool) []byte {
	n := uint32(count)
	if receipt {
		n |= batchReceipt
	}
	dst = append(dst, byte(FrameBatch))
	return binary.BigEndian.AppendUint32(dst, n)
}

// BatchReceipt reports whether a batch frame asks for a receipt, and the
// sequence number of its last entry (0 for an empty batch).
func BatchReceipt(frame []byte) (lastSeq uint64, receipt bool, err error) {
	if len(frame) < BatchHeaderLen || FrameType(frame[0]) != FrameBatch {
		return 0, false, fmt.Errorf("%w: not a batch", ErrBadFrame)
	}
	if binary.BigEndian.Uint32(frame[1:])&batchReceipt == 0 {
		return 0, false, nil
	}
	entries, err := DecodeBatch(frame, nil)
	if err != nil || len(entries) == 0 {
		return 0, true, err
	}
	return entries[len(entries)-1].Seq, true, nil
}

// AppendEntry appends e's encoding to a batch frame.
func AppendEntry(dst []byte, e *Entry) []byte {
	dst = AppendEntryHeader(dst, e)
	if e.Op.HasPayload() {
		dst = append(dst, e.Data...)
	}
	return dst
}

// AppendEntryHeader appends e's encoding without its payload (e.Data,
// when e.Op has one), which must follow it in the frame: a sender that
// writes the payload from where it lies appends the header only. The
// header ends with e's Sums, when it carries them (EntrySums).
func AppendEntryHeader(dst []byte, e *Entry) []byte {
	length := e.Length
	if e.Op.HasPayload() && e.Op != OpVerify {
		length = int64(len(e.Data))
	}
	flags := e.Flags &^ EntrySums
	sums := e.sumsOnWire()
	if sums > 0 {
		flags |= EntrySums
	}
	dst = append(dst, byte(e.Op), flags, 0, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(length))
	dst = binary.BigEndian.AppendUint64(dst, e.Seq)
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.Off))
	for _, sum := range e.Sums[:sums] {
		dst = binary.BigEndian.AppendUint32(dst, sum)
	}
	return dst
}

// ErrBadFrame is returned for a frame that does not decode.
var ErrBadFrame = errors.New("malformed replication frame")

// DecodeBatch decodes a batch frame into entries, appending to dst. The
// entries' Data alias frame.
func DecodeBatch(frame []byte, dst []Entry) ([]Entry, error) {
	dst, _, err := DecodeBatchSums(frame, dst, nil)
	return dst, err
}

// DecodeBatchSums is DecodeBatch that appends the entries' Sums to sums
// and returns it: a reader that reuses dst and sums from one batch to
// the next decodes without allocating.
func DecodeBatchSums(frame []byte, dst []Entry, sums []uint32) ([]Entry, []uint32, error) {
	dst, sums, err := decodeBatch(frame, dst, sums)
	return dst, sums, err
}

func decodeBatch(frame []byte, dst []Entry, sums []uint32) ([]Entry, []uint32, error) {
	if len(frame) < BatchHeaderLen || FrameType(frame[0]) != FrameBatch {
		return dst, sums, fmt.Errorf("%w: not a batch", ErrBadFrame)
	}
	count := binary.BigEndian.Uint32(frame[1:]) &^ batchReceipt
	p := frame[BatchHeaderLen:]
	if uint64(count)*entryHeaderLen > uint64(len(p)) {
		return dst, sums, fmt.Errorf("%w: %d entries do not fit in %d bytes", ErrBadFrame, count, len(p))
	}
	for i := uint32(0); i < count; i++ {
		if len(p) < entryHeaderLen {
			return dst, sums, fmt.Errorf("%w: entry %d truncated", ErrBadFrame, i)
		}
		e := Entry{
			Op:     Op(p[0]),
			Flags:  p[1],
			Length: int64(binary.BigEndian.Uint32(p[4:])),
			Seq:    binary.BigEndian.Uint64(p[8:]),
			Off:    int64(binary.BigEndian.Uint64(p[16:])),
		}
		p = p[entryHeaderLen:]
		if !e.Op.valid() {
			return dst, sums, fmt.Errorf("%w: entry %d has unknown op %d", ErrBadFrame, i, e.Op)
		}
		if e.Off < 0 || e.Length > MaxEntryLength {
			return dst, sums, fmt.Errorf("%w: entry %d offset %d length %d", ErrBadFrame, i, e.Off, e.Length)
		}
		if e.Op == OpVerify {
			// Length is the range verified; the payload its checksums.
			n := int64(ChecksumLen) * ((e.Length + BlockSize - 1) / BlockSize)
			if int64(len(p)) < n {
				return dst, sums, fmt.Errorf("%w: entry %d checksums truncated", ErrBadFrame, i)
			}
			e.Data = p[:n:n]
			p = p[n:]
			dst = append(dst, e)
			continue
		}
		if e.Flags&EntrySums != 0 {
			if !e.Op.CarriesSums() || e.Length == 0 {
				return dst, sums, fmt.Errorf("%w: entry %d: op %d of %d bytes with checksums", ErrBadFrame, i, e.Op, e.Length)
			}
			n := int((e.Length + BlockSize - 1) / BlockSize)
			if len(p) < SumLen*n {
				return dst, sums, fmt.Errorf("%w: entry %d checksums truncated", ErrBadFrame, i)
			}
			first := len(sums)
			for k := range n {
				sums = append(sums, binary.BigEndian.Uint32(p[SumLen*k:]))
			}
			e.Sums = sums[first:len(sums):len(sums)]
			p = p[SumLen*n:]
		}
		if e.Op.HasPayload() {
			if int64(len(p)) < e.Length {
				return dst, sums, fmt.Errorf("%w: entry %d payload truncated", ErrBadFrame, i)
			}
			e.Data = p[:e.Length:e.Length]
			p = p[e.Length:]
		}
		dst = append(dst, e)
	}
	if len(p) != 0 {
		return dst, sums, fmt.Errorf("%w: %d trailing bytes", ErrBadFrame, len(p))
	}
	return dst, sums, nil
}

// AckStatus says how the secondary fared with a batch.
type AckStatus uint32

// Ack statuses.
const (
	AckOK AckStatus = 0
	// AckIOError: the secondary's disk failed an entry; its copy is no
	// longer in sync and the primary must treat it as such.
	AckIOError AckStatus = 1
	// AckRejected: the secondary refuses the stream (stale epoch, not the
	// primary it knows, administratively disconnected).
	AckRejected AckStatus = 2
	// AckReceived: the secondary received every entry up to Seq (in its
	// memory, not yet applied): what protocol B waits for.
	AckReceived AckStatus = 3
	// AckChecksum: the secondary refused the batch, nothing of it
	// applied: a block's data did not match the checksum it came with
	// (corrupted in flight, or in the primary's memory). The stream ends;
	// the primary marks the batch's blocks for a resync.
	AckChecksum AckStatus = 4
)

// Ack acknowledges every entry up to and including Seq.
type Ack struct {
	Seq     uint64
	Status  AckStatus
	Message string
}

// AppendAck encodes an ack frame.
func AppendAck(dst []byte, a Ack) []byte {
	msg := a.Message
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	dst = append(dst, byte(FrameAck))
	dst = binary.BigEndian.AppendUint64(dst, a.Seq)
	dst = binary.BigEndian.AppendUint32(dst, uint32(a.Status))
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(msg)))
	return append(dst, msg...)
}

// DecodeAck decodes an ack frame.
func DecodeAck(frame []byte) (Ack, error) {
	if len(frame) < 15 || FrameType(frame[0]) != FrameAck {
		return Ack{}, fmt.Errorf("%w: not an ack", ErrBadFrame)
	}
	a := Ack{
		Seq:    binary.BigEndian.Uint64(frame[1:]),
		Status: AckStatus(binary.BigEndian.Uint32(frame[9:])),
	}
	n := int(binary.BigEndian.Uint16(frame[13:]))
	if len(frame) != 15+n {
		return Ack{}, fmt.Errorf("%w: ack message length", ErrBadFrame)
	}
	a.Message = string(frame[15:])
	return a, nil
}

// Hello opens a replication stream: the primary introduces itself.
type Hello struct {
	Volume     string     `json:"volume"`
	From       string     `json:"from"`
	To         string     `json:"to"`
	Epoch      uint64     `json:"epoch"`
	Size       int64      `json:"size"`
	Generation Generation `json:"generation"`
	// UUIDs is the primary's generation set toward the peer it dials.
	UUIDs UUIDSet `json:"uuids"`
	// Settings are the primary's settings that must agree (nil from an
	// older node).
	Settings *Settings `json:"settings,omitempty"`
	// Wire is the sender's replication wire version (WireVersion; 0 from a
	// node before versioning: PeerWireVersion).
	Wire int `json:"wire,omitempty"`
	// HandedOver: the sender's term as primary began with a handover from
	// the old primary (a switchover), which leaves no write in flight; a
	// peer adopting it then reconciles no activity log. False (or absent)
	// when it failed over, was forced, or does not know.
	HandedOver bool `json:"handed_over,omitempty"`
}

// Refusal says why a node did not take a replication stream.
type Refusal string

// Refusals. The primary retries after the first seven; the others are
// final (Final): they hold until an operator acts, and the primary stops
// trying (StandAlone).
const (
	RefusedNoVolume     Refusal = "no-such-volume"
	RefusedWrongNode    Refusal = "wrong-node"
	RefusedAdminDown    Refusal = "disconnected-by-operator"
	RefusedSize         Refusal = "size-mismatch"
	RefusedStaleEpoch   Refusal = "stale-epoch"
	RefusedOtherPrimary Refusal = "epoch-of-another-primary"
	// RefusedIdentity: the stream's Hello names a sender (From) that the
	// TLS certificate it came with does not name (a certificate of one
	// node cannot stand in for another), or one that holds no disk of
	// the volume in the refusing node's cluster file. Not final: a
	// sender given its own certificate (a restart with the right files)
	// connects at its next try, without an operator's connect; the
	// refusal is logged once, not at every try.
	RefusedIdentity Refusal = "identity-mismatch"
	// RefusedNewerEpoch: the refusing node is primary at a newer epoch;
	// the sender, an older primary, stops its IO (it is fenced) and
	// follows once the newer primary reaches it.
	RefusedNewerEpoch Refusal = "newer-epoch"
	// RefusedSplitBrain: both nodes changed the data since their last
	// common generation, or both are primary.
	RefusedSplitBrain Refusal = "split-brain"
	// RefusedUnrelated: the two disks share no generation.
	RefusedUnrelated Refusal = "unrelated-data"
)

// Final reports whether the refusal holds until an operator acts.
func (r Refusal) Final() bool {
	switch r {
	case RefusedNewerEpoch, RefusedSplitBrain, RefusedUnrelated:
		return true
	}
	return false
}

// HelloReply is the secondary's answer. When Accepted is false, Refused
// says why (Reason in words) and the primary must not send data.
type HelloReply struct {
	Accepted bool    `json:"accepted"`
	Refused  Refusal `json:"refused,omitempty"`
	Reason   string  `json:"reason,omitempty"`
	// With RefusedSplitBrain: what the refusing node changed since the split
	// (bytes marked for the requester) and when it became primary, so
	// both sides can apply the after-split-brain policy alike. An accepted
	// reply with Changed sets Changes too: the bytes exactly, which the
	// runs, coarsened to fit a frame, may exceed.
	Changes      int64 `json:"changes,omitempty"`
	PrimarySince int64 `json:"primary_since,omitempty"`
	// DiscardFrom and Discard are sent by a node the operator told to
	// discard its data (connect --discard-my-data): the generation its own
	// changes are tracked from, and the 4 KiB blocks it changed since then,
	// as [first, count] runs. The primary resyncs those blocks too.
	DiscardFrom Generation `json:"discard_from,omitempty"`
	Discard     [][2]int64 `json:"discard,omitempty"`
	Generation  Generation `json:"generation"`
	Disk        DiskState  `json:"disk"`
	Epoch       uint64     `json:"epoch"`
	// UUIDs is the secondary's generation set toward the primary.
	UUIDs UUIDSet `json:"uuids"`
	// Changed lists, as [first, count] runs of 4 KiB blocks, what the
	// secondary's own bitmap toward the primary marks: the blocks it holds
	// newer than the primary when the generations make the primary the
	// sync target.
	Changed [][2]int64 `json:"changed,omitempty"`
	// Rule names the generation rule behind a refusal.
	Rule string `json:"rule,omitempty"`
	// Primary: the refusing node is itself primary (at Epoch).
	Primary bool `json:"primary,omitempty"`
	// Settings are the secondary's settings that must agree, sent with
	// a refusal too (nil from an older node).
	Settings *Settings `json:"settings,omitempty"`
	// Wire is the secondary's replication wire version, as in Hello.
	Wire int `json:"wire,omitempty"`
	// Sums: the secondary takes the checksums of the blocks a write or a
	// resync carries (EntrySums); a primary sends them only then (an
	// older node sends none and cannot read them).
	Sums bool `json:"sums,omitempty"`
	// Lost: the secondary records the ranges a resync source holds bad
	// with no good copy anywhere (OpResyncLost); a source sends them only
	// then (an older node refuses the op as unknown).
	Lost bool `json:"lost,omitempty"`
}

// DecodeHello decodes a FrameHello frame: the JSON Hello a primary opens a
// stream with. A frame of another type, JSON that does not decode into a
// Hello, or a negative size is ErrBadFrame.
func DecodeHello(frame []byte) (Hello, error) {
	var h Hello
	if err := decodeJSONFrame(frame, FrameHello, &h); err != nil {
		return Hello{}, err
	}
	if h.Size < 0 {
		return Hello{}, fmt.Errorf("%w: hello for a volume of %d bytes", ErrBadFrame, h.Size)
	}
	return h, nil
}

// DecodeHelloReply decodes a FrameHelloReply frame. Besides what
// DecodeHello refuses, a negative count of changed bytes, and a block run
// (Changed, Discard) that is not a range of whole blocks inside what an
// int64 of bytes addresses, are ErrBadFrame: the primary marks those runs
// in its bitmaps, and a run that wrapped around would mark other blocks.
func DecodeHelloReply(frame []byte) (HelloReply, error) {
	var r HelloReply
	if err := decodeJSONFrame(frame, FrameHelloReply, &r); err != nil {
		return HelloReply{}, err
	}
	if r.Changes < 0 {
		return HelloReply{}, fmt.Errorf("%w: hello reply with %d changed bytes", ErrBadFrame, r.Changes)
	}
	if err := checkBlockRuns("changed", r.Changed); err != nil {
		return HelloReply{}, err
	}
	if err := checkBlockRuns("discard", r.Discard); err != nil {
		return HelloReply{}, err
	}
	return r, nil
}

func decodeJSONFrame(frame []byte, t FrameType, v any) error {
	if len(frame) == 0 || FrameType(frame[0]) != t {
		return fmt.Errorf("%w: expected frame type %d", ErrBadFrame, t)
	}
	if err := json.Unmarshal(frame[1:], v); err != nil {
		return fmt.Errorf("%w: frame type %d: %v", ErrBadFrame, t, err)
	}
	return nil
}

// maxBlocks is the number of 4 KiB blocks an int64 of bytes addresses.
const maxBlocks = math.MaxInt64 / BlockSize

// checkBlockRuns checks [first, count] runs of blocks: first from 0, count
// from 1, and the run's end addressable in bytes.
func checkBlockRuns(what string, runs [][2]int64) error {
	for _, r := range runs {
		if r[0] < 0 || r[1] < 1 || r[0] > maxBlocks-r[1] {
			return fmt.Errorf("%w: %s blocks [%d, +%d] are not a range of blocks", ErrBadFrame, what, r[0], r[1])
		}
	}
	return nil
}

// ReadReplyHeaderLen is the size of a read reply before its data.
const ReadReplyHeaderLen = 1 + 8 + 4

// AppendReadReply encodes the answer to the OpRead entry seq: its data, or
// a failure status and no data.
func AppendReadReply(dst []byte, seq uint64, status AckStatus, data []byte) []byte {
	dst = append(dst, byte(FrameReadReply))
	dst = binary.BigEndian.AppendUint64(dst, seq)
	dst = binary.BigEndian.AppendUint32(dst, uint32(status))
	return append(dst, data...)
}

// DecodeReadReply decodes a read reply; data aliases frame.
func DecodeReadReply(frame []byte) (seq uint64, status AckStatus, data []byte, err error) {
	if len(frame) < ReadReplyHeaderLen || FrameType(frame[0]) != FrameReadReply {
		return 0, 0, nil, fmt.Errorf("%w: not a read reply", ErrBadFrame)
	}
	return binary.BigEndian.Uint64(frame[1:]), AckStatus(binary.BigEndian.Uint32(frame[9:])), frame[ReadReplyHeaderLen:], nil
}

// ChecksumLen is the size of one block checksum.
const ChecksumLen = 8

// BlockChecksum is the checksum verify and checksum-based resync compare:
// CRC-64 (ECMA) of one block. Collisions between two versions of one block
// are negligible for detecting divergence.
func BlockChecksum(block []byte) uint64 { return crc64.Checksum(block, crcTable) }

var crcTable = crc64.MakeTable(crc64.ECMA)

// AppendChecksums appends the checksum of every 4 KiB block of data.
func AppendChecksums(dst, data []byte) []byte {
	for off := 0; off < len(data); off += BlockSize {
		dst = binary.BigEndian.AppendUint64(dst, BlockChecksum(data[off:min(off+BlockSize, len(data))]))
	}
	return dst
}

// Mismatches compares data with the checksums of the same range and
// returns the indexes of the blocks that differ.
func Mismatches(data, checksums []byte) []uint32 {
	var out []uint32
	for i := 0; i*ChecksumLen+ChecksumLen <= len(checksums); i++ {
		off := i * BlockSize
		if off >= len(data) {
			break
		}
		if BlockChecksum(data[off:min(off+BlockSize, len(data))]) != binary.BigEndian.Uint64(checksums[i*ChecksumLen:]) {
			out = append(out, uint32(i))
		}
	}
	return out
}

// EncodeMismatches renders block indexes for a read reply.
func EncodeMismatches(idx []uint32) []byte {
	out := make([]byte, 0, 4*len(idx))
	for _, i := range idx {
		out = binary.BigEndian.AppendUint32(out, i)
	}
	return out
}

// DecodeMismatches parses EncodeMismatches: the indexes of the differing
// blocks of a run of blocks, each once and in increasing order (the
// primary walks them in step with the run's blocks, clearing the bits of
// the others: an index out of order would clear a differing block).
// Anything else is ErrBadFrame.
func DecodeMismatches(b []byte, blocks int64) ([]uint32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%w: mismatch list of %d bytes", ErrBadFrame, len(b))
	}
	if int64(len(b)/4) > blocks {
		return nil, fmt.Errorf("%w: %d mismatches in a run of %d blocks", ErrBadFrame, len(b)/4, blocks)
	}
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.BigEndian.Uint32(b[4*i:])
		if int64(out[i]) >= blocks {
			return nil, fmt.Errorf("%w: mismatch %d names block %d of a run of %d blocks", ErrBadFrame, i, out[i], blocks)
		}
		if i > 0 && out[i] <= out[i-1] {
			return nil, fmt.Errorf("%w: mismatch %d names block %d after block %d", ErrBadFrame, i, out[i], out[i-1])
		}
	}
	return out, nil
}
