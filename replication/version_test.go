package replication

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// The replication wire is versioned so that a cluster can be upgraded one
// node at a time: nodes at most one version apart replicate, and a peer
// further apart is refused in words that name both versions and the node
// to upgrade. A Hello without the field is a node from before it: version 1.
func TestWireVersionsOneApartInteroperate(t *testing.T) {
	for _, tc := range []struct {
		name         string
		mine, theirs int
		ok           bool
		upgrade      string // the node the refusal says to upgrade
	}{
		{"same version", 2, 2, true, ""},
		{"peer one release older", 3, 2, true, ""},
		{"peer one release newer", 2, 3, true, ""},
		{"peer two releases older", 4, 2, false, "beta"},
		{"peer two releases newer", 2, 4, false, "alpha"},
		{"peer from before the field, this node one release on", 2, unversionedWire, true, ""},
		{"peer from before the field, this node two releases on", 3, unversionedWire, false, "beta"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkWireVersion("alpha", tc.mine, "beta", tc.theirs)
			if (err == nil) != tc.ok {
				t.Fatalf("alpha at %d, beta at %d: %v, want ok=%v", tc.mine, tc.theirs, err, tc.ok)
			}
			if err == nil {
				return
			}
			if !errors.Is(err, ErrWireVersion) {
				t.Fatalf("not ErrWireVersion: %v", err)
			}
			for _, want := range []string{"alpha speaks replication wire version", "beta version", "upgrade " + tc.upgrade + " through"} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("%q does not say %q", err, want)
				}
			}
		})
	}
}

func TestThisBuildAcceptsItselfAndTheReleaseBefore(t *testing.T) {
	for _, field := range []int{0, WireVersion - 1, WireVersion, WireVersion + 1} {
		if err := CheckWireVersion("alpha", "beta", field); err != nil {
			t.Errorf("wire field %d: %v", field, err)
		}
	}
	if err := CheckWireVersion("alpha", "beta", WireVersion+2); !errors.Is(err, ErrWireVersion) {
		t.Errorf("wire field %d: %v, want ErrWireVersion", WireVersion+2, err)
	}
	if RefusedWireVersion.Final() {
		t.Error("a wire-version refusal is final: the primary would stop trying once a node was upgraded")
	}
}

// An older node ignores the field (JSON), and a Hello from one, without
// the field, decodes as version 1.
func TestHelloCarriesTheWireVersion(t *testing.T) {
	data, err := json.Marshal(Hello{Volume: "vol0", Wire: WireVersion})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"wire":2`) {
		t.Fatalf("hello JSON %s has no wire field", data)
	}
	h, err := DecodeHello(append([]byte{byte(FrameHello)}, `{"volume":"vol0","from":"beta","to":"alpha","epoch":1,"size":4096}`...))
	if err != nil {
		t.Fatal(err)
	}
	if got := PeerWireVersion(h.Wire); got != 1 {
		t.Fatalf("a hello without the field: version %d, want 1", got)
	}
	r, err := DecodeHelloReply(append([]byte{byte(FrameHelloReply)}, `{"accepted":true,"wire":7}`...))
	if err != nil || r.Wire != 7 {
		t.Fatalf("reply: %+v, %v", r, err)
	}
}
