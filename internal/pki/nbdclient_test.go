package pki

import (
	"path/filepath"
	"testing"
)

// TestLoadNBDClientReadsTheClientsFiles: replctl mount finds the NBD client's certificate in
// the directory certs init wrote, or in its nbd-client/ directory, as libnbd's
// tls-certificates= takes it.
func TestLoadNBDClientReadsTheClientsFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(dir, []Holder{{Identity: Identity{Role: RoleNode, Name: "alpha"}, Hosts: []string{"127.0.0.1"}}}, false); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Join(dir, NBDClientDir)} {
		b, err := LoadNBDClient(d)
		if err != nil {
			t.Fatalf("LoadNBDClient(%s): %v", d, err)
		}
		if b.Self.Role != RoleNBDClient {
			t.Errorf("LoadNBDClient(%s) names %s, want an nbd-client", d, b.Self)
		}
	}
	if _, err := LoadNBDClient(t.TempDir()); err == nil {
		t.Error("LoadNBDClient of an empty directory succeeded")
	}
}
