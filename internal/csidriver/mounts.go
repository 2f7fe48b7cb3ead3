package csidriver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// mountPoints are the mount points of this mount namespace (/proc/self/mountinfo).
func mountPoints() (map[string]bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountPoints(f)
}

// parseMountPoints reads mountinfo's fifth field, the mount point (octal escapes undone).
func parseMountPoints(r io.Reader) (map[string]bool, error) {
	points := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		points[unescapeOctal(f[4])] = true
	}
	return points, sc.Err()
}

// unescapeOctal undoes mountinfo's \NNN escapes (space, tab, newline, backslash).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + (c - '0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// isMountPoint says whether path (made absolute, links resolved) is a mount point; a path
// that does not exist is not.
func isMountPoint(path string) (bool, error) {
	real, err := filepath.EvalSymlinks(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	points, err := mountPoints()
	if err != nil {
		return false, err
	}
	return points[real], nil
}

// holds says whether the mount at path is device's: a file system on it (the mount's device
// number is the device's) or the device itself bound there (a block volume's target).
func holds(path, device string) bool {
	var dev, at unix.Stat_t
	if unix.Stat(device, &dev) != nil || unix.Stat(path, &at) != nil {
		return false
	}
	if at.Mode&unix.S_IFMT == unix.S_IFBLK {
		return at.Rdev == dev.Rdev
	}
	return at.Dev == dev.Rdev
}

// fsType is the file system type blkid finds on device, "" when it finds none.
func fsType(ctx context.Context, device string) (string, error) {
	out, err := exec.CommandContext(ctx, "blkid", "-p", "-o", "value", "-s", "TYPE", device).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return "", nil // blkid: nothing found
	}
	if err != nil {
		return "", fmt.Errorf("blkid %s: %w%s", device, err, stderrOf(err))
	}
	return strings.TrimSpace(string(out)), nil
}

// run runs a tool, its output in the error.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// stderrOf is what a failed command said on stderr, for an error.
func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return ": " + string(bytes.TrimSpace(ee.Stderr))
	}
	return ""
}

// bind binds source on target, read-only when readonly.
func bind(source, target string, readonly bool) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", source, target, err)
	}
	if !readonly {
		return nil
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		_ = unix.Unmount(target, 0)
		return fmt.Errorf("make the bind of %s on %s read-only: %w", source, target, err)
	}
	return nil
}

// busyPatience is how long an unmount waits for a mount that is busy to be let go.
const busyPatience = 5 * time.Second

// unmount unmounts path, waiting up to patience while it is busy (EBUSY). A mount is busy
// for a moment after its last user closed it when a process forked meanwhile by any
// goroutine of this one (replctl, blkid, mkfs) has not reached its exec yet: the child holds
// a copy of every open file until then. A mount still busy after patience is a real user's
// (a pod's process, a shell in it), and its error is returned.
func unmount(ctx context.Context, path string, patience time.Duration) error {
	deadline := time.Now().Add(patience)
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		err := unix.Unmount(path, 0)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// deviceSize is a block device's size in bytes.
func deviceSize(device string) (int64, error) {
	f, err := os.Open(device)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Seek(0, io.SeekEnd)
}

// extSize is the size in bytes of the ext2/3/4 file system dumpe2fs -h described in out
// (Block count times Block size).
func extSize(out string) (int64, error) {
	var count, size int64 = -1, -1
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch strings.TrimSpace(k) {
		case "Block count":
			if err != nil {
				return 0, fmt.Errorf("dumpe2fs: block count %q", v)
			}
			count = n
		case "Block size":
			if err != nil {
				return 0, fmt.Errorf("dumpe2fs: block size %q", v)
			}
			size = n
		}
	}
	if count < 0 || size <= 0 {
		return 0, errors.New("dumpe2fs names no block count and block size")
	}
	return count * size, nil
}

// growExtOffline grows the unmounted ext2/3/4 file system on device to the device's size when
// it is smaller by a block or more: e2fsck -f first (resize2fs asks for it), then resize2fs.
// An unmounted file system is written through the device: no capability is asked for.
func growExtOffline(ctx context.Context, device string, logf func(string, ...any)) error {
	out, err := exec.CommandContext(ctx, "dumpe2fs", "-h", device).Output()
	if err != nil {
		return fmt.Errorf("dumpe2fs -h %s: %w%s", device, err, stderrOf(err))
	}
	fsSize, err := extSize(string(out))
	if err != nil {
		return err
	}
	devSize, err := deviceSize(device)
	if err != nil {
		return err
	}
	if devSize-fsSize < 4096 {
		return nil
	}
	logf("the ext4 on %s is %d bytes, the device %d: growing it before it is mounted", device, fsSize, devSize)
	fsck := exec.CommandContext(ctx, "e2fsck", "-f", "-p", device)
	fout, err := fsck.CombinedOutput()
	var ee *exec.ExitError
	// e2fsck's exit status is a bit set: 1 errors corrected, 2 reboot (a mounted root);
	// 4 and above errors left or an operational failure.
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() < 4) {
		return fmt.Errorf("e2fsck -f -p %s: %w: %s", device, err, bytes.TrimSpace(fout))
	}
	return run(ctx, "resize2fs", device)
}
