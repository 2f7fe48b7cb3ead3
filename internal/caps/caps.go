package caps

import (
	"errors"
	"os"
	"strconv"
	"strings"
)

// Capability bits of linux/capability.h.
const (
	SysAdmin    uint = 21
	SysResource uint = 24
)

// Effective is this process's effective capability set (CapEff in
// /proc/self/status).
func Effective() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		}
	}
	return 0, errors.New("/proc/self/status has no CapEff line")
}

// Has reports whether this process's effective set holds capability bit.
func Has(bit uint) (bool, error) {
	eff, err := Effective()
	if err != nil {
		return false, err
	}
	return eff&(1<<bit) != 0, nil
}
