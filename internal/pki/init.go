package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Validity of the CA and of every certificate Init writes.
const Validity = 10 * 365 * 24 * time.Hour

// GossipKeySize is the size of the memberlist key (AES-256).
const GossipKeySize = 32

// Holder is one certificate to write: its identity and the hosts (DNS
// names or IP addresses) its SANs cover.
type Holder struct {
	Identity
	Hosts []string
}

// Files Init writes into its directory.
const (
	CAFile       = "ca.crt"
	CAKeyFile    = "ca.key"
	GossipFile   = "gossip.key"
	NBDClientDir = "nbd-client" // libnbd's and QEMU's tls-certificates layout
)

// CertFile and KeyFile are the files of a holder's certificate and key:
// NAME.crt and NAME.key (operator.crt for the operator).
func CertFile(name string) string { return name + ".crt" }

// KeyFile is CertFile's key.
func KeyFile(name string) string { return name + ".key" }

// ErrCAExists: Init would overwrite a CA.
var ErrCAExists = errors.New("a CA exists already")

// Init writes a new cluster CA into dir, and for each node its certificate
// and key, the operator's, the memberlist key and the NBD client's files
// (NBDClientDir/ca-cert.pem, client-cert.pem, client-key.pem). Keys are
// mode 0600. It refuses to overwrite a CA unless force. It returns the
// files it wrote.
func Init(dir string, nodes []Holder, force bool) ([]string, error) {
	for _, f := range []string{CAFile, CAKeyFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil && !force {
			return nil, fmt.Errorf("%w in %s (%s): every certificate of the cluster was signed by it; pass --force to make a new CA and new certificates for every node, operator and client", ErrCAExists, dir, f)
		}
	}
	seen := map[string]bool{"operator": true, "ca": true, "gossip": true}
	for _, n := range nodes {
		if n.Role != RoleNode {
			return nil, fmt.Errorf("%s: Init takes nodes only", n.Identity)
		}
		if err := CheckName(n.Name); err != nil {
			return nil, fmt.Errorf("node %w", err)
		}
		if seen[n.Name] {
			return nil, fmt.Errorf("node name %q: used twice, or clashes with a file of the CA", n.Name)
		}
		seen[n.Name] = true
	}
	if err := os.MkdirAll(filepath.Join(dir, NBDClientDir), 0o700); err != nil {
		return nil, err
	}
	w := &writer{dir: dir}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "replvol cluster CA", Organization: []string{"replvol"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	w.file(CAFile, caPEM, 0o644)
	w.key(CAKeyFile, caKey)

	issue := func(h Holder) (certPEM []byte, key *ecdsa.PrivateKey) {
		if w.err != nil {
			return nil, nil
		}
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			w.err = err
			return nil, nil
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: h.Name, Organization: []string{"replvol"}, OrganizationalUnit: []string{string(h.Role)}},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(Validity),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			URIs:         []*neturl.URL{h.URI()},
		}
		for _, host := range h.Hosts {
			if ip := net.ParseIP(host); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else if host != "" {
				tmpl.DNSNames = append(tmpl.DNSNames, host)
			}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			w.err = err
			return nil, nil
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key
	}
	for _, n := range nodes {
		c, k := issue(n)
		w.file(CertFile(n.Name), c, 0o644)
		w.key(KeyFile(n.Name), k)
	}
	c, k := issue(Holder{Identity: Identity{Role: RoleOperator, Name: "operator"}})
	w.file(CertFile("operator"), c, 0o644)
	w.key(KeyFile("operator"), k)
	c, k = issue(Holder{Identity: Identity{Role: RoleNBDClient, Name: "nbd-client"}})
	w.file(filepath.Join(NBDClientDir, "ca-cert.pem"), caPEM, 0o644)
	w.file(filepath.Join(NBDClientDir, "client-cert.pem"), c, 0o644)
	w.key(filepath.Join(NBDClientDir, "client-key.pem"), k)
	gossip := make([]byte, GossipKeySize)
	if _, err := rand.Read(gossip); err != nil {
		return nil, err
	}
	w.file(GossipFile, gossip, 0o600)
	if w.err != nil {
		return w.wrote, w.err
	}
	return w.wrote, syncDir(dir)
}

// LoadGossipKey reads a memberlist key: GossipKeySize raw bytes, or their
// base64 (a key written by hand).
func LoadGossipKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gossip key: %w", err)
	}
	if len(b) == GossipKeySize {
		return b, nil
	}
	if d, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b))); err == nil && len(d) == GossipKeySize {
		return d, nil
	}
	return nil, fmt.Errorf("gossip key %s: %d bytes; want %d random bytes (or their base64), as replctl certs init writes", path, len(b), GossipKeySize)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

// writer writes files durably, remembering the first error.
type writer struct {
	dir   string
	wrote []string
	err   error
}

func (w *writer) file(name string, data []byte, mode os.FileMode) {
	if w.err != nil {
		return
	}
	path := filepath.Join(w.dir, name)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err == nil {
		err = f.Chmod(mode) // whatever the umask
		if err == nil {
			_, err = f.Write(data)
		}
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		w.err = fmt.Errorf("write %s: %w", path, err)
		return
	}
	w.wrote = append(w.wrote, path)
}

func (w *writer) key(name string, k *ecdsa.PrivateKey) {
	if w.err != nil {
		return
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		w.err = err
		return
	}
	w.file(name, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

func syncDir(dir string) error {
	for _, d := range []string{dir, filepath.Join(dir, NBDClientDir)} {
		f, err := os.Open(d)
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
