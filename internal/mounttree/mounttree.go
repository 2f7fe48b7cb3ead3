package mounttree

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Shared returns a temporary directory that is a shared mount of its own, unmounted when
// t ends (after the mounts under it are gone). Without root it is a plain temporary
// directory: the tests that mount need root and say so.
func Shared(t testing.TB) string {
	t.Helper()
	top := t.TempDir()
	if os.Geteuid() != 0 {
		return top
	}
	if err := syscall.Mount(top, top, "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mounting %s onto itself: %v", top, err)
	}
	t.Cleanup(func() {
		if err := unmount(top, 10*time.Second); err != nil {
			t.Errorf("unmounting the test's mount tree %s: %v; mounted under it still: %v", top, err, mountedUnder(top))
			_ = syscall.Unmount(top, syscall.MNT_DETACH)
		}
	})
	if err := syscall.Mount("", top, "", syscall.MS_SHARED, ""); err != nil {
		t.Fatalf("making %s a shared mount: %v", top, err)
	}
	return top
}

// unmount unmounts dir, trying again for up to patience while it is busy: a process that a
// goroutine of the test forked (a tool it ran) holds a copy of every file open in the
// process until its exec, and a FUSE helper that was told to go may still be on its way out.
// A mount still under dir, or a process still in it, after patience is the test's to fix.
func unmount(dir string, patience time.Duration) error {
	deadline := time.Now().Add(patience)
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		err := syscall.Unmount(dir, 0)
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
	}
}

// mountedUnder lists the mount points below dir in this process's mount namespace.
func mountedUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []string{err.Error()}
	}
	defer f.Close()
	var under []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// The fifth field is the mount point (octal escapes aside).
		if fields := strings.Fields(sc.Text()); len(fields) > 4 {
			if p := fields[4]; strings.HasPrefix(p, dir+string(filepath.Separator)) {
				under = append(under, p)
			}
		}
	}
	return under
}
