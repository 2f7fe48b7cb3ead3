package mounttree

import (
	"os"
	"syscall"
	"testing"
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
		if err := syscall.Unmount(top, 0); err != nil {
			t.Errorf("unmounting the test's mount tree %s: %v", top, err)
			_ = syscall.Unmount(top, syscall.MNT_DETACH)
		}
	})
	if err := syscall.Mount("", top, "", syscall.MS_SHARED, ""); err != nil {
		t.Fatalf("making %s a shared mount: %v", top, err)
	}
	return top
}
