package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/transport"
)

// TestMountTarget: replctl mount mounts only on the volume's primary, which must serve; on
// any other node it is refused naming the primary, and a primary that does not serve yet
// (just promoted) is waited for.
func TestMountTarget(t *testing.T) {
	status := func(from, primary, uri string, reason string) *transport.ClusterStatus {
		return &transport.ClusterStatus{From: from, Nodes: []transport.NodeInfo{{Name: "alpha", Control: "10.0.0.1:7800"}, {Name: "beta", Control: "10.0.0.2:7800"}}, Volumes: []transport.VolumeStatus{{
			Name: "vol0", Primary: primary, NBDURI: uri,
			Replicas: []transport.ReplicaStatus{
				{Node: "alpha", Role: roleOf("alpha", primary), Disk: "UpToDate", Replication: "Connected", Reason: reason},
				{Node: "beta", Role: roleOf("beta", primary), Disk: "UpToDate", Replication: "Connected"},
			},
		}}}
	}
	for _, tc := range []struct {
		name     string
		st       *transport.ClusterStatus
		volume   string
		uri      string
		wait     string
		mentions []string
	}{
		{"the primary, serving", status("alpha", "alpha", "nbds://10.0.0.1:7802/vol0", ""), "vol0", "nbds://10.0.0.1:7802/vol0", "", nil},
		{"a secondary", status("beta", "alpha", "nbds://10.0.0.1:7802/vol0", ""), "vol0", "", "", []string{"vol0 is Secondary on beta", "its primary is alpha", "run replctl mount on alpha (--addr 10.0.0.1:7800)"}},
		{"a node with no copy", status("witness", "alpha", "nbd://10.0.0.1:7802/vol0", ""), "vol0", "", "", []string{"witness holds no copy of vol0", "its primary is alpha"}},
		{"no primary", status("beta", "", "", ""), "vol0", "", "", []string{"it has no primary now", "replctl primary vol0 --node NODE"}},
		{"the primary, not serving yet", status("alpha", "alpha", "", "waiting for a peer"), "vol0", "", "vol0 is primary on alpha but does not serve IO yet (waiting for a peer)", nil},
		{"an unknown volume", status("alpha", "alpha", "nbd://10.0.0.1:7802/vol0", ""), "vol9", "", "", []string{`no volume "vol9"`, "the volumes are vol0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uri, wait, err := mountTarget(tc.st, tc.volume)
			if uri != tc.uri || wait != tc.wait {
				t.Fatalf("uri %q wait %q, want %q and %q (err %v)", uri, wait, tc.uri, tc.wait, err)
			}
			if (err != nil) != (tc.mentions != nil) {
				t.Fatalf("err %v", err)
			}
			for _, m := range tc.mentions {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("%q does not say %q", err, m)
				}
			}
			var np *notPrimaryError
			if tc.name == "a secondary" && (!errors.As(err, &np) || np.Primary != "alpha" || np.PrimaryAddr != "10.0.0.1:7800" || exitCode(err) != exitFailed) {
				t.Errorf("a secondary's refusal: %#v, exit code %d", err, exitCode(err))
			}
		})
	}
}

func roleOf(node, primary string) string {
	if node == primary {
		return "Primary"
	}
	return "Secondary"
}

// TestMountOfATLSExportNeedsTheNBDClientsCertificate: an nbds:// export is refused before
// anything is set up unless --tls-dir holds the NBD client's certificate, saying where it
// should be; a plaintext export needs none.
func TestMountOfATLSExportNeedsTheNBDClientsCertificate(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, []pki.Holder{{Identity: pki.Identity{Role: pki.RoleNode, Name: "alpha"}, Hosts: []string{"127.0.0.1"}}}, false); err != nil {
		t.Fatal(err)
	}
	const export = "nbds://127.0.0.1:7802/vol0"
	for _, tc := range []struct {
		name, tlsDir, uri string
		mentions          string
	}{
		{"no --tls-dir", "", export, "pass --tls-dir DIR"},
		{"a --tls-dir without nbd-client/", t.TempDir(), export, "with nbd-client/"},
		{"the directory certs init wrote", dir, export, ""},
		{"a plaintext export", "", "nbd://127.0.0.1:7802/vol0", ""},
	} {
		err := (&globals{tlsDir: tc.tlsDir}).checkNBDCertificate(tc.uri)
		if tc.mentions == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.mentions) || exitCode(err) != exitUsage {
			t.Errorf("%s: %v (exit code %d), want a usage error saying %q", tc.name, err, exitCode(err), tc.mentions)
		}
	}
}

// TestAMountOnASecondaryGivesTheCommandForThePrimary: the refusal of replctl mount on a node
// that is not the primary gives the command to run instead: the user's own, at the primary's
// control address (the flags given kept, --addr replaced, words with spaces quoted).
func TestAMountOnASecondaryGivesTheCommandForThePrimary(t *testing.T) {
	root := newRoot()
	mount, _, err := root.Find([]string{"mount"})
	if err != nil {
		t.Fatal(err)
	}
	if err := mount.ParseFlags([]string{"--addr", "unix:///var/lib/replvol/control.sock", "--tls-dir", "/etc/replvol/tls", "--mkfs", "-o", "noatime", "--run-dir", "/run/my mounts"}); err != nil {
		t.Fatal(err)
	}
	err = &notPrimaryError{Volume: "vol0", Here: "alpha", Role: "Secondary", Primary: "beta", PrimaryAddr: "127.0.0.1:7803",
		Retry: retryMount(mount, []string{"vol0", "/mnt/vol0"}, "127.0.0.1:7803")}
	want := "vol0 is Secondary on alpha (the node at --addr): its primary is beta; run replctl mount on beta: " +
		"replctl --addr 127.0.0.1:7803 mount vol0 /mnt/vol0 --mkfs --options noatime --run-dir '/run/my mounts' --tls-dir /etc/replvol/tls"
	if err.Error() != want {
		t.Fatalf("the refusal says\n%s\nwant\n%s", err, want)
	}
}
