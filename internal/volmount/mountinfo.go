package volmount

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	// Dir is the mount point, Source what is mounted (a device, or the FUSE file system's
	// name), FSType its type (ext4, fuse.replvol, ...), Dev the device number of its file
	// system, MAJOR:MINOR (7:3 for /dev/loop3).
	Dir, Source, FSType, Dev string
}

// readMounts reads this process's mount table.
func readMounts() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountinfo(f)
}

// parseMountinfo parses proc(5)'s mountinfo: "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 -
// ext3 /dev/root rw,errors=continue", with octal escapes (\040) in paths.
func parseMountinfo(r io.Reader) ([]mountEntry, error) {
	var out []mountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || len(fields) < sep+3 {
			return nil, fmt.Errorf("mountinfo: malformed line %q", sc.Text())
		}
		out = append(out, mountEntry{Dir: unescapeOctal(fields[4]), FSType: fields[sep+1], Source: unescapeOctal(fields[sep+2]), Dev: fields[2]})
	}
	return out, sc.Err()
}

// unescapeOctal undoes the kernel's \NNN escapes of space, tab, newline and backslash.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountedOn returns the topmost mount on dir, if any.
func mountedOn(mounts []mountEntry, dir string) (mountEntry, bool) {
	var found mountEntry
	ok := false
	for _, m := range mounts {
		if m.Dir == dir {
			found, ok = m, true // later lines are mounted on top
		}
	}
	return found, ok
}
