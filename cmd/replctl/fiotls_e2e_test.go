package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestE2EFioOverTLSByTheGuidesRecipe: docs/production.md's recipe for fio
// against a cluster whose NBD export needs TLS runs as the guide writes
// it, with the guide's host, port and certificate directory replaced by
// the test cluster's and its 30 s benchmark by a 32 MiB write that fio
// then reads back and checks (crc32c): fio's own nbd engine reaches the
// volume over TLS through nbdkit, writes and reads what it says, nothing
// is left running, and the writes are on both replicas. fio given the
// nbds:// URI itself is refused by libnbd (logged, not asserted: the
// recipe is what is pinned).
func TestE2EFioOverTLSByTheGuidesRecipe(t *testing.T) {
	e2eBeside(t)
	fio := RequireTool(t, "fio", "fio")
	RequireTool(t, "nbdkit", "nbdkit")
	sh := RequireTool(t, "sh", "dash")
	const (
		size    = 64 << 20
		written = 32 << 20
	)
	recipe := guideCommand(t, "nbdkit -U - --run 'fio ")

	c := newProcClusterN(t, clusterOpts{TLS: true, NBDTLS: "required", Size: size})
	c.startAll()
	c.waitInSync("alpha")
	host, port, err := net.SplitHostPort(c.nodes["alpha"].NBD)
	if err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(c.tlsDir, "nbd-client")
	cmd := recipe
	for _, r := range []struct{ guide, here string }{
		{"hostname=10.0.0.1", "hostname=" + host},
		{"port=7802", "port=" + port},
		{"export=vol0", "export=" + volName},
		{"tls-certificates=/etc/replvol/tls/nbd-client", "tls-certificates=" + certs},
		{"--size=1g --runtime=30 --time_based", "--size=32m --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 --output-format=json"},
	} {
		if !strings.Contains(cmd, r.guide) {
			t.Fatalf("docs/production.md's fio recipe has no %q: the test no longer fits it:\n%s", r.guide, recipe)
		}
		cmd = strings.Replace(cmd, r.guide, r.here, 1)
	}

	direct := "nbds://" + c.nodes["alpha"].NBD + "/" + volName + "?tls-certificates=" + certs
	d := runCmdIn(t.TempDir(), time.Minute, nil, fio, "--name=direct", "--ioengine=nbd", "--uri="+direct, "--rw=read", "--bs=4k", "--size=4k")
	refusal := lastLine(d.out)
	for line := range strings.Lines(d.out) {
		if strings.Contains(line, "nbd_connect_uri") {
			refusal = strings.TrimSpace(line)
			break
		}
	}
	t.Logf("fio given %s itself: %s", direct, refusal)

	before, err := c.writeBytes("alpha")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the guide's recipe, for this cluster: %s", cmd)
	r := runCmdIn(t.TempDir(), 2*time.Minute, nil, sh, "-c", cmd)
	if !r.ok() {
		t.Fatalf("the guide's fio recipe over TLS: %s", r)
	}
	res, err := parseFio(r.out)
	if err != nil {
		t.Fatal(err)
	}
	if res.Error != 0 || res.Write.IOBytes != written || res.Read.IOBytes != written {
		t.Fatalf("fio through the guide's recipe: error %d, wrote %d, verified %d bytes (want %d each)", res.Error, res.Write.IOBytes, res.Read.IOBytes, written)
	}
	after, err := c.writeBytes("alpha")
	if err != nil {
		t.Fatal(err)
	}
	if after-before < written {
		t.Fatalf("alpha wrote %d bytes while fio wrote %d through the recipe: fio did not reach the volume", after-before, written)
	}
	c.waitInSync("alpha")
	compareFiles(t, c.disk("alpha"), c.disk("beta"), size)
}

// guideCommand returns the command of docs/production.md's shell blocks
// that starts with prefix, its continuation lines (ending in \) joined.
func guideCommand(t *testing.T, prefix string) string {
	t.Helper()
	raw, err := os.ReadFile("../../docs/production.md")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	inBlock := false
	lines := strings.Split(string(raw), "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(line, "```") {
			inBlock = !inBlock
			continue
		}
		if !inBlock || !strings.HasPrefix(line, prefix) {
			continue
		}
		cmd := line
		for strings.HasSuffix(cmd, `\`) && i+1 < len(lines) {
			i++
			cmd = strings.TrimSuffix(cmd, `\`) + " " + strings.TrimSpace(lines[i])
		}
		found = append(found, cmd)
	}
	if len(found) != 1 {
		t.Fatalf("docs/production.md has %d commands starting %q in its shell blocks, want 1", len(found), prefix)
	}
	return found[0]
}
