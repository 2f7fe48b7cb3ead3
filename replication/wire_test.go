package replication

import (
	"bytes"
	"errors"
	"slices"
	"testing"
)

func TestBatchRoundTrip(t *testing.T) {
	in := []Entry{
		{Op: OpWrite, Flags: EntryFUA, Seq: 1, Off: 4096, Data: []byte("hello")},
		{Op: OpZero, Seq: 2, Off: 0, Length: 1 << 20},
		{Op: OpFlush, Seq: 3},
		{Op: OpResyncData, Seq: 4, Off: 8192, Data: bytes.Repeat([]byte{7}, 4096)},
		{Op: OpSyncDone, Seq: 5, Data: make([]byte, 16)},
		{Op: OpResyncLost, Seq: 6, Off: 3 * 4096, Length: 2 * 4096},
	}
	frame := AppendBatchHeader(nil, len(in))
	for i := range in {
		frame = AppendEntry(frame, &in[i])
	}
	out, err := DecodeBatch(frame, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) {
		t.Fatalf("%d entries, want %d", len(out), len(in))
	}
	for i := range in {
		want := in[i]
		if want.Op.HasPayload() {
			want.Length = int64(len(want.Data))
		}
		got := out[i]
		if got.Op != want.Op || got.Flags != want.Flags || got.Seq != want.Seq || got.Off != want.Off || got.Length != want.Length || !bytes.Equal(got.Data, want.Data) {
			t.Fatalf("entry %d: got %+v want %+v", i, got, want)
		}
	}
}

func TestDecodeBatchRejectsDamage(t *testing.T) {
	e := Entry{Op: OpWrite, Seq: 1, Off: 0, Data: []byte("abcd")}
	good := AppendEntry(AppendBatchHeader(nil, 1), &e)
	cases := map[string][]byte{
		"empty":           nil,
		"not a batch":     append([]byte{byte(FrameAck)}, good[1:]...),
		"truncated":       good[:len(good)-1],
		"trailing bytes":  append(append([]byte(nil), good...), 0),
		"count too large": append([]byte{byte(FrameBatch), 0xff, 0xff, 0xff, 0xff}, good[5:]...),
		"unknown op":      func() []byte { b := append([]byte(nil), good...); b[5] = 99; return b }(),
		"op after lost":   func() []byte { b := append([]byte(nil), good...); b[5] = byte(OpResyncLost + 1); return b }(),
	}
	for name, frame := range cases {
		if _, err := DecodeBatch(frame, nil); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

func TestAckRoundTrip(t *testing.T) {
	a := Ack{Seq: 42, Status: AckIOError, Message: "disk gone"}
	got, err := DecodeAck(AppendAck(nil, a))
	if err != nil || got != a {
		t.Fatalf("got %+v, %v", got, err)
	}
	if _, err := DecodeAck([]byte{byte(FrameAck), 1}); err == nil {
		t.Fatal("short ack decoded")
	}
}

func TestReadReplyRoundTrip(t *testing.T) {
	seq, st, data, err := DecodeReadReply(AppendReadReply(nil, 7, AckOK, []byte("block")))
	if err != nil || seq != 7 || st != AckOK || string(data) != "block" {
		t.Fatalf("got %d %d %q %v", seq, st, data, err)
	}
	if _, _, _, err := DecodeReadReply([]byte{byte(FrameReadReply), 1}); err == nil {
		t.Fatal("short read reply decoded")
	}
}

func TestVerifyEntryAndMismatches(t *testing.T) {
	primary := bytes.Repeat([]byte{1}, 3*BlockSize)
	secondary := append([]byte(nil), primary...)
	secondary[BlockSize+7] = 9 // block 1 differs
	e := Entry{Op: OpVerify, Seq: 3, Off: 8192, Length: int64(len(primary)), Data: AppendChecksums(nil, primary)}
	out, err := DecodeBatch(AppendEntry(AppendBatchHeader(nil, 1), &e), nil)
	if err != nil || len(out) != 1 || out[0].Length != int64(len(primary)) || !bytes.Equal(out[0].Data, e.Data) {
		t.Fatalf("verify entry round trip: %+v %v", out, err)
	}
	idx, err := DecodeMismatches(EncodeMismatches(Mismatches(secondary, out[0].Data)), 3)
	if err != nil || len(idx) != 1 || idx[0] != 1 {
		t.Fatalf("mismatches %v %v, want [1]", idx, err)
	}
}

// TestHandshakeDecodersRefuseDamage: a Hello or HelloReply that does not
// decode, or that names what no honest node sends (a negative size, a
// run of blocks that wraps around), is ErrBadFrame: the stream ends
// before anything is marked or written.
func TestHandshakeDecodersRefuseDamage(t *testing.T) {
	frame := func(t FrameType, body string) []byte { return append([]byte{byte(t)}, body...) }
	for name, f := range map[string][]byte{
		"empty":                         nil,
		"a reply where a hello belongs": frame(FrameHelloReply, `{}`),
		"not JSON":                      frame(FrameHello, "\x16\x03\x01\x00"),
		"a negative size":               frame(FrameHello, `{"volume":"vol0","size":-4096}`),
		"a short generation":            frame(FrameHello, `{"uuids":{"current":"41"}}`),
	} {
		if _, err := DecodeHello(f); !errors.Is(err, ErrBadFrame) {
			t.Errorf("hello, %s: %v, want ErrBadFrame", name, err)
		}
	}
	for name, f := range map[string][]byte{
		"a hello where a reply belongs": frame(FrameHello, `{}`),
		"a negative block":              frame(FrameHelloReply, `{"accepted":true,"changed":[[-1,2]]}`),
		"an empty run":                  frame(FrameHelloReply, `{"accepted":true,"discard":[[0,0]]}`),
		"a run past 8 EiB":              frame(FrameHelloReply, `{"accepted":true,"changed":[[2251799813685247,1]]}`),
		"negative changes":              frame(FrameHelloReply, `{"refused":"split-brain","changes":-8192}`),
	} {
		if _, err := DecodeHelloReply(f); !errors.Is(err, ErrBadFrame) {
			t.Errorf("reply, %s: %v, want ErrBadFrame", name, err)
		}
	}
	if _, err := DecodeHelloReply(frame(FrameHelloReply, `{"accepted":true,"changed":[[2251799813685246,1]]}`)); err != nil {
		t.Errorf("the last block an int64 addresses: %v", err)
	}
}

// TestEntrySumsTravelBetweenHeaderAndPayload: a write or a resync with
// Sums carries them (EntrySums), by copy or with its payload by
// reference; one without is encoded as before, byte for byte; a frame
// whose sums are cut short, or on an op that carries none, is refused.
func TestEntrySumsTravelBetweenHeaderAndPayload(t *testing.T) {
	data := bytes.Repeat([]byte{7}, 2*BlockSize+100)
	sums := []uint32{0x01020304, 0xa0b0c0d0, 0xdeadbeef}
	in := []Entry{
		{Op: OpWrite, Flags: EntryFUA, Seq: 1, Off: 8192, Length: int64(len(data)), Data: data, Sums: sums},
		{Op: OpResyncData, Seq: 2, Off: 0, Length: BlockSize, Data: data[:BlockSize], Sums: sums[:1]},
		{Op: OpWrite, Seq: 3, Off: 4096, Length: 10, Data: data[:10]},
		{Op: OpFlush, Seq: 4, Sums: sums},
	}
	frame := AppendBatchHeader(nil, len(in))
	for i := range in {
		if i == 0 {
			// By reference: the header (with the sums), then the payload.
			frame = append(AppendEntryHeader(frame, &in[i]), in[i].Data...)
			continue
		}
		frame = AppendEntry(frame, &in[i])
	}
	want := BatchHeaderLen
	for i := range in {
		want += in[i].EncodedLen()
	}
	if len(frame) != want {
		t.Fatalf("frame of %d bytes, EncodedLen says %d", len(frame), want)
	}
	out, scratch, err := DecodeBatchSums(frame, nil, make([]uint32, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range out {
		wantSums := in[i].Sums
		if !in[i].Op.CarriesSums() {
			wantSums = nil
		}
		if !slices.Equal(e.Sums, wantSums) || !bytes.Equal(e.Data, in[i].Data) || e.Off != in[i].Off || e.Flags&EntryFUA != in[i].Flags&EntryFUA {
			t.Fatalf("entry %d: %+v, sent %+v", i, e, in[i])
		}
		if (e.Flags&EntrySums != 0) != (len(wantSums) > 0) {
			t.Fatalf("entry %d: flags %02x", i, e.Flags)
		}
	}
	if len(scratch) != 4 {
		t.Fatalf("%d sums appended to the scratch, want 4", len(scratch))
	}
	// Without Sums the encoding is the one older nodes read.
	plain := Entry{Op: OpWrite, Seq: 9, Off: 0, Length: BlockSize, Data: data[:BlockSize]}
	old := append([]byte{byte(OpWrite), 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0}, data[:BlockSize]...)
	if got := AppendEntry(nil, &plain); !bytes.Equal(got, old) {
		t.Fatalf("an entry without sums encodes as %x..., want %x...", got[:24], old[:24])
	}
	// Damage: sums cut short; a flush with the flag.
	short := AppendBatchHeader(nil, 1)
	short = AppendEntryHeader(short, &in[1])[:BatchHeaderLen+entryHeaderLen+2]
	flush := append(AppendBatchHeader(nil, 1), byte(OpFlush), EntrySums, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0)
	for name, f := range map[string][]byte{"sums cut short": short, "a flush with sums": flush} {
		if _, err := DecodeBatch(f, nil); !errors.Is(err, ErrBadFrame) {
			t.Errorf("%s: %v, want ErrBadFrame", name, err)
		}
	}
}
