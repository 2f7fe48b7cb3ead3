package pki

import "path/filepath"

// The files of an NBD client's certificate in Init's NBDClientDir (libnbd's and QEMU's
// tls-certificates layout).
const (
	NBDClientCAFile   = "ca-cert.pem"
	NBDClientCertFile = "client-cert.pem"
	NBDClientKeyFile  = "client-key.pem"
)

// LoadNBDClient reads the NBD client's bundle from dir, a directory Init wrote (its
// NBDClientDir), or such a directory itself.
func LoadNBDClient(dir string) (*Bundle, error) {
	if filepath.Base(filepath.Clean(dir)) != NBDClientDir {
		dir = filepath.Join(dir, NBDClientDir)
	}
	return Load(filepath.Join(dir, NBDClientCAFile), filepath.Join(dir, NBDClientCertFile), filepath.Join(dir, NBDClientKeyFile))
}
