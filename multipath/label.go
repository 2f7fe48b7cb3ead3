package multipath

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
)

// The label: see doc.go for the layout.
const (
	// LabelSize is the bytes the label reserves at the end of the device.
	LabelSize    = 4096
	labelVersion = 1
	labelSumOff  = LabelSize - 4
)

var labelMagic = [16]byte{'R', 'E', 'P', 'L', 'V', 'O', 'L', '-', 'M', 'P', 'A', 'T', 'H', 0, 0, 0}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var (
	// ErrNoLabel: the path carries no replvol label.
	ErrNoLabel = errors.New("multipath: no replvol label")
	// ErrCorruptLabel: the label's checksum or version is wrong.
	ErrCorruptLabel = errors.New("multipath: corrupt replvol label")
	// ErrLabelMismatch: the path carries the label of another LUN.
	ErrLabelMismatch = errors.New("multipath: path belongs to another LUN")
	// ErrTooSmall: the device cannot hold a label and a block of data.
	ErrTooSmall = errors.New("multipath: device too small for a label")
)

// UUID names a LUN. Every path to the LUN carries it in its label.
type UUID [16]byte

// NewUUID returns a random (version 4) UUID.
func NewUUID() UUID {
	var u UUID
	_, _ = rand.Read(u[:]) // crypto/rand.Read never fails
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

// ParseUUID reads the 8-4-4-4-12 hex form String prints.
func ParseUUID(s string) (UUID, error) {
	var u UUID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, fmt.Errorf("LUN UUID %q: want the form 01234567-89ab-cdef-0123-456789abcdef", s)
	}
	h := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:36]
	if _, err := hex.Decode(u[:], []byte(h)); err != nil {
		return UUID{}, fmt.Errorf("LUN UUID %q: %w", s, err)
	}
	return u, nil
}

func (u UUID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], u[10:16])
	return string(b[:])
}

// IsZero reports whether u is the zero UUID (no LUN).
func (u UUID) IsZero() bool { return u == UUID{} }

// LabelOffset is where the label of a device of size bytes starts: the
// last whole 4 KiB block. Everything before it is data.
func LabelOffset(size int64) (int64, error) {
	off := size/LabelSize*LabelSize - LabelSize
	if off < LabelSize {
		return 0, fmt.Errorf("%w: %d bytes, need at least %d", ErrTooSmall, size, 2*LabelSize)
	}
	return off, nil
}

// UsableSize is the data a device of size bytes holds once labelled.
func UsableSize(size int64) int64 {
	off, err := LabelOffset(size)
	if err != nil {
		return 0
	}
	return off
}

// EncodeLabel returns the label block of LUN u.
func EncodeLabel(u UUID) []byte {
	b := make([]byte, LabelSize)
	encodeLabel(b, u)
	return b
}

func encodeLabel(b []byte, u UUID) {
	clear(b[:LabelSize])
	copy(b[0:16], labelMagic[:])
	binary.LittleEndian.PutUint32(b[16:20], labelVersion)
	copy(b[24:40], u[:])
	binary.LittleEndian.PutUint32(b[labelSumOff:], crc32.Checksum(b[:labelSumOff], castagnoli))
}

// DecodeLabel reads a label block: the LUN's UUID, ErrNoLabel when the
// block holds no label, ErrCorruptLabel when it holds a damaged or newer
// one.
func DecodeLabel(b []byte) (UUID, error) {
	if len(b) < LabelSize || !bytes.Equal(b[0:16], labelMagic[:]) {
		return UUID{}, ErrNoLabel
	}
	want := binary.LittleEndian.Uint32(b[labelSumOff:])
	if got := crc32.Checksum(b[:labelSumOff], castagnoli); got != want {
		return UUID{}, fmt.Errorf("%w: checksum %08x, want %08x", ErrCorruptLabel, got, want)
	}
	if v := binary.LittleEndian.Uint32(b[16:20]); v != labelVersion {
		return UUID{}, fmt.Errorf("%w: format version %d, this replvol reads %d", ErrCorruptLabel, v, labelVersion)
	}
	var u UUID
	copy(u[:], b[24:40])
	if u.IsZero() {
		return UUID{}, fmt.Errorf("%w: zero LUN UUID", ErrCorruptLabel)
	}
	return u, nil
}

// WriteLabel writes the label of LUN u at the end of p and syncs it: the
// label is durable BEFORE WriteLabel returns. Every other path to the
// same LUN then reads it too.
func WriteLabel(p Path, u UUID) error {
	if u.IsZero() {
		return errors.New("multipath: cannot label a LUN with the zero UUID")
	}
	size, err := p.Size()
	if err != nil {
		return fmt.Errorf("label path %s: size: %w", p.Name(), err)
	}
	off, err := LabelOffset(size)
	if err != nil {
		return fmt.Errorf("label path %s: %w", p.Name(), err)
	}
	b := alignedBuffer(LabelSize)
	encodeLabel(b, u)
	if _, err := p.WriteAt(b, off); err != nil {
		return fmt.Errorf("label path %s: %w", p.Name(), err)
	}
	if err := p.Sync(); err != nil {
		return fmt.Errorf("label path %s: sync: %w", p.Name(), err)
	}
	return nil
}

// ReadLabel returns the UUID of the LUN behind p (errors as DecodeLabel,
// or the path's IO error).
func ReadLabel(p Path) (UUID, error) {
	size, err := p.Size()
	if err != nil {
		return UUID{}, fmt.Errorf("read label of path %s: size: %w", p.Name(), err)
	}
	off, err := LabelOffset(size)
	if err != nil {
		return UUID{}, fmt.Errorf("read label of path %s: %w", p.Name(), err)
	}
	return readLabelAt(p, off, alignedBuffer(LabelSize))
}

func readLabelAt(p Path, off int64, buf []byte) (UUID, error) {
	if _, err := p.ReadAt(buf[:LabelSize], off); err != nil {
		return UUID{}, err
	}
	return DecodeLabel(buf)
}
