package config

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/replvol/replvol/internal/pki"
)

// A node checks, on its own host, what the file names for it: the node
// is in the file, and its TLS files can be read, hold what they should
// and name it. These problems join the file's own in one report
// (LoadNodeConfig), each with the line of the field that names the file,
// so that the operator fixes everything in one pass.

// LoadNodeConfig is LoadConfig for the node named node, on its host
// (replnode): the problems of the file and, in the same report, those of
// the files it names for that node (tls.ca, the node's tls.cert and
// tls.key, tls.gossip_key), and a node the file does not list.
func LoadNodeConfig(path, node string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return parse(path, data, node)
}

// nodeProblems lists what is wrong for node name on this host: that the
// file does not list it, and its TLS files (file is the config file, for
// the command that writes them).
func (c *Config) nodeProblems(file, name string) []Problem {
	var ps []Problem
	bad := func(field, format string, args ...any) {
		ps = append(ps, Problem{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if _, ok := c.Node(name); !ok {
		var names []string
		for _, n := range c.Nodes {
			names = append(names, n.Name)
		}
		if len(names) > 0 {
			bad("nodes", "no node %q (--node): the nodes are %s", name, strings.Join(names, ", "))
		}
		return ps
	}
	t := c.TLS
	if t == nil {
		return ps
	}
	// What writes the files, for a file that is not there.
	init := func(path string) string {
		cfg := file
		if cfg == "" {
			cfg = "CLUSTER_FILE"
		}
		return fmt.Sprintf("run replctl certs init --config %s --dir %s on one host (it writes the CA, every node's certificate and key, and the gossip key) and copy %s's files to this host",
			cfg, filepath.Dir(path), name)
	}
	readable := func(field, what, path string) ([]byte, bool) {
		b, err := os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			bad(field, "%s %s: no such file: %s", what, path, init(path))
		case err != nil:
			bad(field, "%s %s: %v", what, path, unwrapPath(err))
		default:
			return b, true
		}
		return nil, false
	}
	var caOK, certOK, keyOK bool
	if t.CA != "" {
		var ca []byte
		if ca, caOK = readable("tls.ca", "the CA certificate", t.CA); caOK && !x509.NewCertPool().AppendCertsFromPEM(ca) {
			bad("tls.ca", "the CA certificate %s holds no PEM certificate: point tls.ca at the ca.crt replctl certs init wrote", t.CA)
			caOK = false
		}
	}
	cert, key := t.CertFor(name), t.KeyFor(name)
	if t.Cert != "" {
		var b []byte
		if b, certOK = readable("tls.cert", name+"'s certificate", cert); certOK {
			if blk, _ := pem.Decode(b); blk == nil || blk.Type != "CERTIFICATE" {
				bad("tls.cert", "%s's certificate %s holds no PEM certificate: point tls.cert at the %s.crt replctl certs init wrote", name, cert, name)
				certOK = false
			}
		}
	}
	if t.Key != "" {
		_, keyOK = readable("tls.key", name+"'s key", key)
	}
	if caOK && certOK && keyOK {
		b, err := pki.Load(t.CA, cert, key)
		switch {
		case err != nil:
			bad("tls.cert", "%v: give %s the certificate and key replctl certs init wrote for it, signed by the CA in tls.ca", err, name)
		case b.Self != pki.Identity{Role: pki.RoleNode, Name: name}:
			bad("tls.cert", "%s names %s, not node %s: give this node its own certificate (%s.crt and %s.key from replctl certs init)", cert, b.Self, name, name, name)
		}
	}
	if t.GossipKey != "" {
		if _, ok := readable("tls.gossip_key", "the gossip key", t.GossipKey); ok {
			if _, err := pki.LoadGossipKey(t.GossipKey); err != nil {
				bad("tls.gossip_key", "%v", err)
			}
		}
	}
	return ps
}

// unwrapPath is err without the path an *fs.PathError repeats (the
// problem names the file already): "permission denied".
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
