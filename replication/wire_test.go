package replication

import (
	"bytes"
	"testing"
)

func TestBatchRoundTrip(t *testing.T) {
	in := []Entry{
		{Op: OpWrite, Flags: EntryFUA, Seq: 1, Off: 4096, Data: []byte("hello")},
		{Op: OpZero, Seq: 2, Off: 0, Length: 1 << 20},
		{Op: OpFlush, Seq: 3},
		{Op: OpResyncData, Seq: 4, Off: 8192, Data: bytes.Repeat([]byte{7}, 4096)},
		{Op: OpSyncDone, Seq: 5, Data: make([]byte, 16)},
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

func FuzzDecodeBatch(f *testing.F) {
	e := Entry{Op: OpWrite, Seq: 1, Off: 4096, Data: []byte("payload")}
	f.Add(AppendEntry(AppendBatchHeader(nil, 1), &e))
	f.Add(AppendBatchHeader(nil, 0))
	f.Add([]byte{byte(FrameBatch), 0, 0, 0, 2})
	f.Fuzz(func(t *testing.T, frame []byte) {
		entries, err := DecodeBatch(frame, nil)
		if err != nil {
			return
		}
		// What decodes must encode back to the same bytes.
		again := AppendBatchHeader(nil, len(entries))
		for i := range entries {
			if entries[i].Off < 0 || entries[i].Length > MaxEntryLength {
				t.Fatalf("decoded an out-of-bounds entry %+v", entries[i])
			}
			again = AppendEntry(again, &entries[i])
		}
		// Padding bytes are not checked on decode; compare the rest.
		if len(again) != len(frame) {
			t.Fatalf("re-encoded %d bytes from %d", len(again), len(frame))
		}
	})
}

func FuzzDecodeAck(f *testing.F) {
	f.Add(AppendAck(nil, Ack{Seq: 1, Message: "x"}))
	f.Fuzz(func(t *testing.T, frame []byte) {
		a, err := DecodeAck(frame)
		if err == nil && len(a.Message) > len(frame) {
			t.Fatal("message longer than the frame")
		}
	})
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
	idx, err := DecodeMismatches(EncodeMismatches(Mismatches(secondary, out[0].Data)))
	if err != nil || len(idx) != 1 || idx[0] != 1 {
		t.Fatalf("mismatches %v %v, want [1]", idx, err)
	}
}
