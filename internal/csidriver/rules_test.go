package csidriver

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestVolumeSizeRoundsUpToAWholeBlockWithinTheLimit(t *testing.T) {
	for _, tc := range []struct {
		name            string
		required, limit int64
		want            uint64
		code            codes.Code
	}{
		{"no range gives the default size", 0, 0, DefaultSize, codes.OK},
		{"a limit below the default gives the limit rounded down", 0, 10*BlockSize + 5, 10 * BlockSize, codes.OK},
		{"a limit above the default gives the default", 0, 4 * DefaultSize, DefaultSize, codes.OK},
		{"a limit below a block fits nothing", 0, BlockSize - 1, 0, codes.OutOfRange},
		{"a whole number of blocks is kept", 3 * BlockSize, 0, 3 * BlockSize, codes.OK},
		{"one byte past a block is rounded up", BlockSize + 1, 0, 2 * BlockSize, codes.OK},
		{"rounded up within the limit", BlockSize + 1, 2 * BlockSize, 2 * BlockSize, codes.OK},
		{"rounded up past a limit that is no whole block", BlockSize + 1, BlockSize + 100, 0, codes.OutOfRange},
		{"required above the limit", 2 * BlockSize, BlockSize, 0, codes.OutOfRange},
		{"negative bytes", -1, 0, 0, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := volumeSize(&csi.CapacityRange{RequiredBytes: tc.required, LimitBytes: tc.limit})
			if status.Code(err) != tc.code || got != tc.want {
				t.Fatalf("volumeSize(%d, %d) = %d, %v; want %d, %s", tc.required, tc.limit, got, err, tc.want, tc.code)
			}
			if err == nil && !fits(got, &csi.CapacityRange{RequiredBytes: tc.required, LimitBytes: tc.limit}) {
				t.Fatalf("the size chosen, %d, does not fit its own range", got)
			}
		})
	}
	if got, err := volumeSize(nil); err != nil || got != DefaultSize {
		t.Fatalf("volumeSize(nil) = %d, %v; want the default", got, err)
	}
}

func TestFitsSaysWhetherAnExistingSizeMeetsTheRange(t *testing.T) {
	r := &csi.CapacityRange{RequiredBytes: 10 << 20, LimitBytes: 20 << 20}
	for size, want := range map[uint64]bool{10 << 20: true, 20 << 20: true, 10<<20 - 1: false, 20<<20 + 1: false} {
		if fits(size, r) != want {
			t.Errorf("fits(%d, [10 MiB, 20 MiB]) = %v, want %v", size, !want, want)
		}
	}
}

func TestParseParamsTakesReplicasPoolAndProtocolAndRefusesOthers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   volumeParams
		code   codes.Code
	}{
		{"none: the cluster's defaults", nil, volumeParams{}, codes.OK},
		{"all three", map[string]string{"replicas": "3", "pool": "fast", "protocol": "a"}, volumeParams{Replicas: 3, Pool: "fast", Protocol: "A"}, codes.OK},
		{"csi-provisioner's own are passed over", map[string]string{"csi.storage.k8s.io/pvc/name": "data", "replicas": "2"}, volumeParams{Replicas: 2}, codes.OK},
		{"zero replicas", map[string]string{"replicas": "0"}, volumeParams{}, codes.InvalidArgument},
		{"replicas not a number", map[string]string{"replicas": "two"}, volumeParams{}, codes.InvalidArgument},
		{"an unknown protocol", map[string]string{"protocol": "D"}, volumeParams{}, codes.InvalidArgument},
		{"a misspelt parameter", map[string]string{"replica": "2"}, volumeParams{}, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseParams(tc.params)
			if status.Code(err) != tc.code || (err == nil && got != tc.want) {
				t.Fatalf("parseParams(%v) = %+v, %v; want %+v, %s", tc.params, got, err, tc.want, tc.code)
			}
		})
	}
	_, err := parseParams(map[string]string{"replica": "2"})
	if msg := status.Convert(err).Message(); !strings.Contains(msg, `"replica"`) || !strings.Contains(msg, ParamReplicas) {
		t.Fatalf("the refusal of a misspelt parameter does not name it and those known: %q", msg)
	}
}

func TestPageWalksTheListAndAbortsOnAForeignToken(t *testing.T) {
	// Five volumes, two a page: tokens lead through every one exactly once.
	var seen []int
	token := ""
	for range 10 {
		start, end, next, err := page(5, token, 2)
		if err != nil {
			t.Fatal(err)
		}
		for i := start; i < end; i++ {
			seen = append(seen, i)
		}
		if next == "" {
			break
		}
		token = next
	}
	if len(seen) != 5 || seen[0] != 0 || seen[4] != 4 {
		t.Fatalf("pages of 2 over 5 volumes gave %v", seen)
	}
	if start, end, next, err := page(5, "", 0); err != nil || start != 0 || end != 5 || next != "" {
		t.Fatalf("max_entries 0: [%d, %d) next %q, %v; want all in one page", start, end, next, err)
	}
	for _, bad := range []string{"x", "-1", "6"} {
		if _, _, _, err := page(5, bad, 2); status.Code(err) != codes.Aborted {
			t.Errorf("token %q: %v, want Aborted", bad, err)
		}
	}
	if _, _, _, err := page(5, "", -1); status.Code(err) != codes.InvalidArgument {
		t.Errorf("max_entries -1: %v, want InvalidArgument", err)
	}
}

func TestSupportedCapabilitiesAreSingleNodeMountOrBlock(t *testing.T) {
	mode := func(m csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability_AccessMode {
		return &csi.VolumeCapability_AccessMode{Mode: m}
	}
	mount := func(fs string) *csi.VolumeCapability_Mount {
		return &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}}
	}
	block := &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	for _, tc := range []struct {
		name string
		c    *csi.VolumeCapability
		ok   bool
	}{
		{"single node writer, mount", &csi.VolumeCapability{AccessMode: mode(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), AccessType: mount("")}, true},
		{"single node reader, xfs", &csi.VolumeCapability{AccessMode: mode(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY), AccessType: mount("xfs")}, true},
		{"single node single writer, block", &csi.VolumeCapability{AccessMode: mode(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER), AccessType: block}, true},
		{"multi node writer", &csi.VolumeCapability{AccessMode: mode(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER), AccessType: mount("")}, false},
		{"single node multi writer", &csi.VolumeCapability{AccessMode: mode(csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER), AccessType: block}, false},
		{"a file system replvol does not make", &csi.VolumeCapability{AccessMode: mode(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), AccessType: mount("btrfs")}, false},
		{"no access type", &csi.VolumeCapability{AccessMode: mode(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}, false},
		{"none", nil, false},
	} {
		if got := supported(tc.c) == ""; got != tc.ok {
			t.Errorf("%s: supported = %v, want %v (%s)", tc.name, got, tc.ok, supported(tc.c))
		}
	}
	if err := checkCapabilities(nil); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no capabilities: %v, want InvalidArgument", err)
	}
}

func TestPoolCapacityIsWhatTheNthLargestNodeHasFree(t *testing.T) {
	pools := []transport.PoolStatus{
		{Node: "alpha", Name: "default", Free: 100 << 20},
		{Node: "beta", Name: "default", Free: 40<<20 + 123},
		{Node: "gamma", Name: "default", Free: 70 << 20},
		{Node: "alpha", Name: "fast", Free: 500 << 20},
	}
	for _, tc := range []struct {
		pool     string
		replicas int
		want     uint64
	}{
		{"", 0, 70 << 20},         // default pool, two copies: alpha and gamma
		{"default", 1, 100 << 20}, // one copy: the node with the most
		{"default", 3, 40 << 20},  // three: beta's, rounded down to a block
		{"default", 4, 0},         // more copies than nodes
		{"fast", 2, 0},            // one node has the pool
		{"none", 1, 0},
	} {
		if got := poolCapacity(pools, tc.pool, tc.replicas); got != tc.want {
			t.Errorf("poolCapacity(%q, %d) = %d, want %d", tc.pool, tc.replicas, got, tc.want)
		}
	}
}

func TestAPIErrorKeepsTheControlAPICodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{status.Error(codes.AlreadyExists, "vol0 exists with another size"), codes.AlreadyExists},
		{status.Error(codes.ResourceExhausted, "no pool with room"), codes.ResourceExhausted},
		{status.Error(codes.Unimplemented, "older replnode"), codes.Unimplemented},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{errors.New("dial: connection refused"), codes.Unavailable},
	} {
		if got := status.Code(apiError("create volume v", tc.err)); got != tc.want {
			t.Errorf("apiError(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

func TestParseMountPointsUndoesEscapes(t *testing.T) {
	in := "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - ext4 /dev/loop0 rw\n37 35 98:0 / /plain rw - ext4 /dev/loop1 rw\n"
	got, err := parseMountPoints(strings.NewReader(in))
	if err != nil || !got["/mnt/a b"] || !got["/plain"] || len(got) != 2 {
		t.Fatalf("parseMountPoints = %v, %v", got, err)
	}
}

// TestMissingGrowCapability: growing a mounted ext4 asks for CAP_SYS_RESOURCE, a mounted xfs
// for CAP_SYS_ADMIN; a process that has it lacks nothing, and another file system is not
// this rule's.
func TestMissingGrowCapability(t *testing.T) {
	const all, none = ^uint64(0), uint64(0)
	for _, c := range []struct {
		fs     string
		capEff uint64
		want   string
	}{
		{"ext4", none, "CAP_SYS_RESOURCE"},
		{"ext4", all &^ (1 << 24), "CAP_SYS_RESOURCE"},
		{"ext4", 1 << 24, ""},
		{"ext3", 1 << 21, "CAP_SYS_RESOURCE"},
		{"xfs", all &^ (1 << 21), "CAP_SYS_ADMIN"},
		{"xfs", 1 << 21, ""},
		{"btrfs", none, ""},
	} {
		if got := missingGrowCapability(c.fs, c.capEff); got != c.want {
			t.Errorf("missingGrowCapability(%q, %#x) = %q, want %q", c.fs, c.capEff, got, c.want)
		}
	}
}

// TestExtSize: the size of an ext4 is its block count times its block size, as dumpe2fs -h
// says them; output without them is an error.
func TestExtSize(t *testing.T) {
	out := "dumpe2fs 1.47.0 (5-Feb-2023)\nFilesystem volume name:   <none>\nBlock count:              16384\nReserved block count:     819\nBlock size:               4096\nFragment size:            4096\n"
	if got, err := extSize(out); err != nil || got != 64<<20 {
		t.Fatalf("extSize = %d, %v; want %d", got, err, 64<<20)
	}
	for _, bad := range []string{"", "Block count: 16384\n", "Block count: x\nBlock size: 4096\n"} {
		if _, err := extSize(bad); err == nil {
			t.Errorf("extSize(%q) took it", bad)
		}
	}
}
