package node

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLayering pins the package seams of DESIGN.md §7: the replication
// rules import none of the project's I/O packages, and the control API
// client that replctl uses does not link the daemon.
func TestLayering(t *testing.T) {
	forbidden := map[string][]string{
		"github.com/replvol/replvol/replication": {"/transport", "/node", "/web", "/metadata", "google.golang.org/grpc", "go.etcd.io/bbolt"},
		"github.com/replvol/replvol/transport":   {"/node", "/web", "/metadata"},
		"github.com/replvol/replvol/web":         {"/node", "/metadata", "/replication"},
		"github.com/replvol/replvol/metadata":    {"/node", "/transport", "/web"},
	}
	for pkg, bad := range forbidden {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range bad {
				name := b
				if strings.HasPrefix(b, "/") {
					name = "github.com/replvol/replvol" + b
				}
				if dep == name || strings.HasPrefix(dep, name+"/") {
					t.Errorf("%s imports %s", pkg, dep)
				}
			}
		}
	}
}
