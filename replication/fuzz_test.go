package replication

// Fuzz targets for every frame a node decodes from a peer: the batch and
// its receipt, the ack, the read reply and the verify mismatches it
// carries, and the JSON Hello and HelloReply of the handshake, through the
// rules that judge them. The property in every case: no panic, what
// decodes encodes back to the same frame (or the same value), and what
// the rules decide from it is one of their known outcomes. Each target
// has a committed seed corpus (testdata/fuzz/TARGET), real frames of the
// encoders and edge cases, which TestFuzzSeedCorpus keeps the same as the
// seeds below; an input the fuzzer finds failing is written there too
// and stays.
//
//	go test -run '^$' -fuzz '^FuzzHelloReply$' ./replication

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/replvol/replvol/internal/fuzzseed"
)

func byteSeeds(frames ...[]byte) []fuzzseed.Seed {
	seeds := make([]fuzzseed.Seed, len(frames))
	for i, f := range frames {
		seeds[i] = fuzzseed.Seed{f}
	}
	return seeds
}

func addSeeds(f *testing.F, seeds []fuzzseed.Seed) {
	for _, s := range seeds {
		f.Add(s...)
	}
}

func batchFrame(receipt bool, entries ...Entry) []byte {
	b := AppendBatchHeaderReceipt(nil, len(entries), receipt)
	for i := range entries {
		b = AppendEntry(b, &entries[i])
	}
	return b
}

// seedBatches: one batch of every op, a receipt batch, an empty one and
// the damage DecodeBatch must refuse.
func seedBatches() []fuzzseed.Seed {
	block := bytes.Repeat([]byte{0xab}, 64)
	all := batchFrame(false,
		Entry{Op: OpWrite, Flags: EntryFUA, Seq: 1, Off: 4096, Data: []byte("payload")},
		Entry{Op: OpZero, Seq: 2, Off: 8192, Length: 1 << 20},
		Entry{Op: OpTrim, Seq: 3, Off: 0, Length: 4096},
		Entry{Op: OpFlush, Seq: 4},
		Entry{Op: OpResyncData, Seq: 5, Off: 12288, Data: block},
		Entry{Op: OpResyncZero, Seq: 6, Off: 16384, Length: 8192},
		Entry{Op: OpSyncStart, Seq: 7, Data: genA[:]},
		Entry{Op: OpSyncDone, Seq: 8, Data: genA[:]},
		Entry{Op: OpRead, Seq: 9, Off: 4096, Length: 4096},
		Entry{Op: OpVerify, Seq: 10, Off: 0, Length: 2 * BlockSize, Data: AppendChecksums(nil, make([]byte, 2*BlockSize))},
		Entry{Op: OpResyncLost, Seq: 11, Off: 8192, Length: BlockSize},
	)
	receipt := batchFrame(true, Entry{Op: OpWrite, Seq: 41, Off: 0, Data: []byte("x")}, Entry{Op: OpFlush, Seq: 42})
	return byteSeeds(
		all,
		receipt,
		AppendBatchHeader(nil, 0),
		[]byte{byte(FrameBatch), 0, 0, 0, 2},
		all[:len(all)-1],
		append([]byte{byte(FrameBatch), 0xff, 0xff, 0xff, 0xff}, all[BatchHeaderLen:]...),
		batchFrame(false, Entry{Op: OpZero, Seq: 1, Off: 0, Length: MaxEntryLength + 1}),
	)
}

func seedAcks() []fuzzseed.Seed {
	return byteSeeds(
		AppendAck(nil, Ack{Seq: 1}),
		AppendAck(nil, Ack{Seq: 7, Status: AckIOError, Message: "beta: write at 4096: input/output error"}),
		AppendAck(nil, Ack{Seq: 9, Status: AckRejected, Message: "stale epoch"}),
		AppendAck(nil, Ack{Seq: 1 << 40, Status: AckReceived}),
		[]byte{byte(FrameAck), 1},
	)
}

// FuzzDecodeBatch: the decoder never panics, and what it accepts holds
// only entries inside the bounds and encodes back to as many bytes.
func FuzzDecodeBatch(f *testing.F) {
	addSeeds(f, seedBatches())
	f.Fuzz(func(t *testing.T, frame []byte) {
		entries, err := DecodeBatch(frame, nil)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("error of no class: %v", err)
			}
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

// FuzzDecodeAck: the decoder never panics, and what it accepts encodes
// back to the same frame.
func FuzzDecodeAck(f *testing.F) {
	addSeeds(f, seedAcks())
	f.Fuzz(func(t *testing.T, frame []byte) {
		a, err := DecodeAck(frame)
		if err != nil {
			return
		}
		if len(a.Message) > len(frame) {
			t.Fatal("message longer than the frame")
		}
		if len(a.Message) <= 1024 && !bytes.Equal(AppendAck(nil, a), frame) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", frame, a, AppendAck(nil, a))
		}
	})
}

// seedBatchReceipts: batches with and without the receipt flag, one
// whose entries do not decode, and frames that are no batch.
func seedBatchReceipts() []fuzzseed.Seed {
	receipt := batchFrame(true, Entry{Op: OpWrite, Seq: 41, Off: 0, Data: []byte("x")}, Entry{Op: OpFlush, Seq: 42})
	return byteSeeds(
		receipt,
		batchFrame(false, Entry{Op: OpWrite, Seq: 41, Off: 0, Data: []byte("x")}),
		AppendBatchHeaderReceipt(nil, 0, true),
		receipt[:len(receipt)-3],
		append(AppendBatchHeaderReceipt(nil, 1, true), make([]byte, entryHeaderLen)...),
		AppendAck(nil, Ack{Seq: 42, Status: AckReceived}),
		nil,
	)
}

// FuzzBatchReceipt: a secondary running protocol B acknowledges a batch
// on receipt, before applying it, when BatchReceipt says so. A receipt is
// given only for a batch that asks for one and decodes whole, for the
// sequence number of its last entry.
func FuzzBatchReceipt(f *testing.F) {
	addSeeds(f, seedBatchReceipts())
	f.Fuzz(func(t *testing.T, frame []byte) {
		seq, receipt, err := BatchReceipt(frame)
		if len(frame) < BatchHeaderLen || FrameType(frame[0]) != FrameBatch {
			if err == nil || !errors.Is(err, ErrBadFrame) || receipt || seq != 0 {
				t.Fatalf("not a batch: %d, %v, %v", seq, receipt, err)
			}
			return
		}
		asks := binary.BigEndian.Uint32(frame[1:])&batchReceipt != 0
		if receipt != asks {
			t.Fatalf("receipt %v for a batch whose header asks %v", receipt, asks)
		}
		if !asks {
			if err != nil || seq != 0 {
				t.Fatalf("a batch without receipt: %d, %v", seq, err)
			}
			return
		}
		entries, derr := DecodeBatch(frame, nil)
		switch {
		case derr != nil:
			if err == nil {
				t.Fatalf("receipt %d for a batch that does not decode: %v", seq, derr)
			}
		case err != nil:
			t.Fatalf("a batch that decodes has no receipt: %v", err)
		case len(entries) == 0 && seq != 0, len(entries) > 0 && seq != entries[len(entries)-1].Seq:
			t.Fatalf("receipt for %d, the batch ends at %+v", seq, entries)
		}
	})
}

// seedReadReplies: the answer to a read (data), a verify's mismatches,
// a failed read, and damage.
func seedReadReplies() []fuzzseed.Seed {
	return byteSeeds(
		AppendReadReply(nil, 9, AckOK, bytes.Repeat([]byte{7}, 512)),
		AppendReadReply(nil, 10, AckOK, EncodeMismatches([]uint32{0, 3})),
		AppendReadReply(nil, 11, AckIOError, nil),
		[]byte{byte(FrameReadReply), 1},
		append([]byte{byte(FrameAck)}, AppendReadReply(nil, 1, AckOK, nil)[1:]...),
	)
}

// FuzzDecodeReadReply: the decoder never panics, and what it accepts
// encodes back to the very same frame (its data is the rest of it).
func FuzzDecodeReadReply(f *testing.F) {
	addSeeds(f, seedReadReplies())
	f.Fuzz(func(t *testing.T, frame []byte) {
		seq, st, data, err := DecodeReadReply(frame)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("error of no class: %v", err)
			}
			if len(frame) >= ReadReplyHeaderLen && FrameType(frame[0]) == FrameReadReply {
				t.Fatalf("refused a read reply: %v", err)
			}
			return
		}
		if again := AppendReadReply(nil, seq, st, data); !bytes.Equal(again, frame) {
			t.Fatalf("%x decodes to %d %d %x, which encodes to %x", frame, seq, st, data, again)
		}
	})
}

// seedMismatches: lists of differing blocks of a verify run of up to 16
// blocks, as EncodeMismatches writes them, and damage.
func seedMismatches() []fuzzseed.Seed {
	return []fuzzseed.Seed{
		{EncodeMismatches([]uint32{1}), uint16(3)},
		{EncodeMismatches([]uint32{0, 5, 7, 15}), uint16(16)},
		{EncodeMismatches(nil), uint16(16)},
		{[]byte{0, 0, 1}, uint16(16)},
		{EncodeMismatches([]uint32{5, 1}), uint16(16)},
		{EncodeMismatches([]uint32{2, 2}), uint16(16)},
		{EncodeMismatches([]uint32{16}), uint16(16)},
		{EncodeMismatches([]uint32{1 << 31}), uint16(0)},
	}
}

// FuzzDecodeMismatches: the blocks a peer names as differing after a
// verify or checksum resync are marked for resync, and the others are
// marked in sync. What decodes names blocks of the run only, each once
// and in order (the primary walks them in step with the run's blocks: a
// list out of order would clear a differing block), and encodes back to
// the same bytes.
func FuzzDecodeMismatches(f *testing.F) {
	addSeeds(f, seedMismatches())
	f.Fuzz(func(t *testing.T, b []byte, blocks uint16) {
		idx, err := DecodeMismatches(b, int64(blocks))
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("error of no class: %v", err)
			}
			return
		}
		for k, i := range idx {
			if int64(i) >= int64(blocks) || k > 0 && i <= idx[k-1] {
				t.Fatalf("decoded %v for a run of %d blocks", idx, blocks)
			}
		}
		if again := EncodeMismatches(idx); !bytes.Equal(again, b) {
			t.Fatalf("%x decodes to %v, which encodes to %x", b, idx, again)
		}
	})
}

// The judging node's own generations toward the peer, for the handshake
// targets: genA current, genB its bitmap, genC and genD older. The seeds
// name these so that the fuzzer starts from every row of the table.
var judgeLocal = set(genA, genB, genC, genD)

// judgeSettings are the judging node's settings that must agree.
var judgeSettings = Settings{Protocol: "C", AfterSB: SBDisconnect, Size: 1 << 30}

func helloFrame(t FrameType, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return append([]byte{byte(t)}, b...)
}

// seedHellos: a primary's Hello for each row of the generation table, one
// of an older node (no settings), and damage.
func seedHellos() []fuzzseed.Seed {
	hello := func(u UUIDSet, s *Settings) Hello {
		return Hello{Volume: "vol0", From: "alpha", To: "beta", Epoch: 3, Size: 1 << 30, Generation: u.Current, UUIDs: u, Settings: s}
	}
	var seeds [][]byte
	for _, u := range []UUIDSet{
		set(genA, empty, genB),       // reconnected
		set(empty, empty),            // just created
		set(genE, genA, genC),        // the peer tracks from my current: bitmap-peer
		set(genE, empty, genA, genC), // history-peer
		set(genB, empty, genC),       // bitmap-self
		set(genC, empty, genD),       // history-self
		set(genE, genB, genD),        // bitmap-both
		set(genE, empty, genD),       // history-both
		set(gen('Z'), empty, gen('Y')),
		{Current: genA, CrashedPrimary: true, NodeID: 1},
	} {
		seeds = append(seeds, helloFrame(FrameHello, hello(u, &Settings{Protocol: "C", AfterSB: SBDisconnect, Size: 1 << 30})))
	}
	seeds = append(seeds,
		[]byte(`{"volume":"vol0","from":"alpha","to":"beta","epoch":1,"size":4096}`),
		append([]byte{byte(FrameHello)}, `{"volume":"vol0","from":"alpha","to":"beta","epoch":1,"size":4096}`...),
		helloFrame(FrameHello, hello(set(genA, empty), &Settings{Protocol: "A", AfterSB: SBDiscardLeastChanges, Size: 4096})),
		append([]byte{byte(FrameHello)}, `{"size":-1}`...),
		append([]byte{byte(FrameHello)}, `{"uuids":{"current":"41"}}`...),
		append([]byte{byte(FrameHello)}, `null`...),
		helloFrame(FrameHelloReply, HelloReply{Accepted: true}),
	)
	return byteSeeds(seeds...)
}

var knownRules = map[string][]int{
	RuleJustCreatedBoth: {10}, RuleJustCreatedSelf: {20}, RuleJustCreatedPeer: {30},
	RuleSyncSourceMissedFinish: {34}, RuleSyncTargetPeerMissedFinish: {35},
	RuleSyncSourcePeerMissedFinish: {36}, RuleSyncTargetMissedFinish: {37}, RulePrimaryMissedFinish: {37},
	RuleReconnected: {40}, RuleCrashedPrimary: {40, 41},
	RuleBitmapPeer: {50}, RuleBitmapPeerHistory: {55}, RuleHistoryPeer: {60}, RuleBitmapSelf: {70}, RuleBitmapSelfHistory: {75}, RuleHistorySelf: {80},
	RuleBitmapBoth: {90}, RuleHistoryBoth: {100}, RuleUnrelated: {1000},
}

// judgeGenerations runs CompareUUIDs the way both ends of a handshake do
// (each role pair) and checks that every decision is a known outcome by a
// known rule, and the same every time.
func judgeGenerations(t *testing.T, peer UUIDSet) {
	t.Helper()
	for _, roles := range [][]Role{nil, {Secondary, Primary}, {Primary, Secondary}, {Primary, Primary}} {
		d := CompareUUIDs(judgeLocal, peer, roles...)
		if d.Outcome < NoResync || d.Outcome > UnrelatedData {
			t.Fatalf("%v: unknown outcome", d)
		}
		numbers, ok := knownRules[d.Rule]
		if !ok || !slices.Contains(numbers, d.RuleNumber) {
			t.Fatalf("%v: rule %q number %d is not a row of the table", d, d.Rule, d.RuleNumber)
		}
		if d.Repair != nil && d.Rule != RuleSyncSourceMissedFinish {
			t.Fatalf("%v: a repair by rule %s", d, d.Rule)
		}
		if again := CompareUUIDs(judgeLocal, peer, roles...); !reflect.DeepEqual(again, d) {
			t.Fatalf("the same sets decide %v, then %v", d, again)
		}
		_ = d.String()
		_ = d.Outcome.Mirror().String()
	}
}

// judgeSettingsOf compares the peer's settings with the judging node's,
// as both ends of a handshake do: a difference names a known setting
// with two different values, each side set.
func judgeSettingsOf(t *testing.T, theirs *Settings) {
	t.Helper()
	if theirs == nil {
		return
	}
	for _, d := range judgeSettings.Diff(*theirs) {
		switch d.Setting {
		case SettingProtocol, SettingAfterSB, SettingSize:
		default:
			t.Fatalf("difference in an unknown setting %+v", d)
		}
		if d.Mine == "" || d.Theirs == "" || d.Mine == d.Theirs {
			t.Fatalf("difference %+v", d)
		}
	}
	if len(theirs.Diff(*theirs)) != 0 {
		t.Fatalf("%+v differs from itself", theirs)
	}
}

// FuzzHello: the Hello a secondary receives from whoever connects to its
// replication port. What decodes has a size from 0, its encoding decodes
// to a Hello of the same encoding, and its generations and settings,
// judged as the secondary judges them, give a known decision.
func FuzzHello(f *testing.F) {
	addSeeds(f, seedHellos())
	f.Fuzz(func(t *testing.T, frame []byte) {
		h, err := DecodeHello(frame)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("error of no class: %v", err)
			}
			return
		}
		if h.Size < 0 {
			t.Fatalf("accepted a hello of size %d", h.Size)
		}
		// Its encoding decodes to a Hello of the same encoding (an empty
		// list and none encode alike).
		enc := helloFrame(FrameHello, h)
		again, err := DecodeHello(enc)
		if err != nil || !bytes.Equal(helloFrame(FrameHello, again), enc) {
			t.Fatalf("%+v encodes to %q, which decodes to %+v, %v", h, enc, again, err)
		}
		judgeGenerations(t, h.UUIDs)
		judgeSettingsOf(t, h.Settings)
	})
}

// seedHelloReplies: an acceptance with changed blocks, each kind of
// refusal, a discard-my-data answer, an older node's, and damage.
func seedHelloReplies() []fuzzseed.Seed {
	s := &Settings{Protocol: "C", AfterSB: SBDiscardLeastChanges, Size: 1 << 30}
	var seeds [][]byte
	for _, r := range []HelloReply{
		{Accepted: true, Generation: genA, Disk: UpToDate, Epoch: 3, UUIDs: set(genA, empty, genB), Settings: s},
		{Accepted: true, Generation: genB, Disk: Outdated, Epoch: 3, UUIDs: set(genB, genA, genC), Changed: [][2]int64{{0, 1}, {7, 3}}, Settings: s},
		{Accepted: true, Generation: genE, Disk: UpToDate, Epoch: 3, UUIDs: set(genE, genA), DiscardFrom: genA, Discard: [][2]int64{{2, 2}}},
		{Refused: RefusedSplitBrain, Reason: "split-brain (bitmap-both)", Rule: RuleBitmapBoth, Changes: 8192, PrimarySince: 1700000000000000000, Epoch: 4, Primary: true, Settings: s},
		{Refused: RefusedStaleEpoch, Reason: "stale epoch", Epoch: 9},
		{Refused: RefusedNewerEpoch, Reason: "newer epoch", Rule: "newer-epoch", Epoch: 9, Primary: true},
		{Refused: RefusedSize, Reason: "volume vol0 is 4096 bytes on beta", Settings: &Settings{Size: 4096}},
		{Refused: RefusedUnrelated, Rule: RuleUnrelated, UUIDs: set(gen('Z'), empty)},
		{Refused: RefusedNoVolume},
		{Refused: RefusedWrongNode}, {Refused: RefusedAdminDown}, {Refused: RefusedOtherPrimary},
		{Reason: `node beta holds no volume "vol9"`},
	} {
		seeds = append(seeds, helloFrame(FrameHelloReply, r))
	}
	seeds = append(seeds,
		append([]byte{byte(FrameHelloReply)}, `{"accepted":true,"changed":[[-1,2]]}`...),
		append([]byte{byte(FrameHelloReply)}, `{"accepted":true,"changed":[[2251799813685247,1]]}`...),
		append([]byte{byte(FrameHelloReply)}, `{"accepted":true,"discard":[[0,0]]}`...),
		append([]byte{byte(FrameHelloReply)}, `{"refused":"split-brain","changes":-8192}`...),
		append([]byte{byte(FrameHelloReply)}, `{"accepted":true,"uuids":{"history":[null,"00"]}}`...),
		helloFrame(FrameHello, Hello{Volume: "vol0"}),
	)
	return byteSeeds(seeds...)
}

// judgeVolumeBlocks is the volume the fuzzed runs are marked in.
const judgeVolumeBlocks = 256

// FuzzHelloReply: the answer a primary receives from the node it dialed.
// What decodes has block runs inside what an int64 of bytes addresses
// (marking them in a bitmap marks exactly their blocks: no run wraps
// around onto others), its encoding decodes to a reply of the same
// encoding, and its generations, settings and split-brain facts, judged
// as the primary judges them, give a known decision that both sides of a
// split brain reach alike.
func FuzzHelloReply(f *testing.F) {
	addSeeds(f, seedHelloReplies())
	f.Fuzz(func(t *testing.T, frame []byte) {
		r, err := DecodeHelloReply(frame)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("error of no class: %v", err)
			}
			return
		}
		enc := helloFrame(FrameHelloReply, r)
		again, err := DecodeHelloReply(enc)
		if err != nil || !bytes.Equal(helloFrame(FrameHelloReply, again), enc) {
			t.Fatalf("%+v encodes to %q, which decodes to %+v, %v", r, enc, again, err)
		}
		_ = r.Refused.Final()
		judgeGenerations(t, r.UUIDs)
		judgeSettingsOf(t, r.Settings)
		for _, runs := range [][][2]int64{r.Changed, r.Discard} {
			bm := NewBitmap(judgeVolumeBlocks * BlockSize)
			want := map[int64]bool{}
			for _, run := range runs {
				if run[0] < 0 || run[1] < 1 || run[0] > maxBlocks-run[1] {
					t.Fatalf("accepted the run %v", run)
				}
				bm.SetRange(run[0]*BlockSize, run[1]*BlockSize)
				for b := run[0]; b < min(run[0]+run[1], judgeVolumeBlocks); b++ {
					want[b] = true
				}
			}
			if bm.Count() != int64(len(want)) {
				t.Fatalf("runs %v mark %d blocks of %d, want %d", runs, bm.Count(), judgeVolumeBlocks, len(want))
			}
			for b := range want {
				if !bm.AnySet(b*BlockSize, BlockSize) {
					t.Fatalf("runs %v do not mark block %d", runs, b)
				}
			}
		}
		me := SplitBrainSide{Changes: 4096, PrimarySince: 1700000000000000000}
		peer := SplitBrainSide{Changes: r.Changes, PrimarySince: r.PrimarySince}
		mirror := map[SplitBrainVictim]SplitBrainVictim{VictimNone: VictimNone, VictimMe: VictimPeer, VictimPeer: VictimMe}
		for _, p := range []AfterSplitBrain{SBDisconnect, SBDiscardYoungerPrimary, SBDiscardLeastChanges, SBDiscardZeroChanges} {
			mine, theirs := ResolveSplitBrain(p, me, peer), ResolveSplitBrain(p, peer, me)
			if theirs != mirror[mine] {
				t.Fatalf("%s: I pick %v, the peer picks %v", p, mine, theirs)
			}
		}
	})
}

// TestFuzzSeedCorpus keeps each target's committed corpus the seeds
// above (go test -run TestFuzzSeedCorpus -write-fuzz-seeds rewrites it).
func TestFuzzSeedCorpus(t *testing.T) {
	for target, seeds := range map[string][]fuzzseed.Seed{
		"FuzzDecodeBatch":      seedBatches(),
		"FuzzDecodeAck":        seedAcks(),
		"FuzzBatchReceipt":     seedBatchReceipts(),
		"FuzzDecodeReadReply":  seedReadReplies(),
		"FuzzDecodeMismatches": seedMismatches(),
		"FuzzHello":            seedHellos(),
		"FuzzHelloReply":       seedHelloReplies(),
	} {
		fuzzseed.Sync(t, target, seeds, fuzzseed.Exact)
	}
}
