package csidriver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// bindFile binds a new file on another new file in a temporary directory, as NodePublishVolume
// binds a block device on its target, and returns the target; the test's cleanup unmounts it if
// it is still mounted.
func bindFile(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("binds need root: .ci/run runs the suite as root")
		}
		t.Skip("binds need root")
	}
	dir := t.TempDir()
	source, target := filepath.Join(dir, "source"), filepath.Join(dir, "target")
	for _, p := range []string{source, target} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := bind(source, target, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	return target
}

// TestAnUnmountWaitsForAMountHeldForAMoment: a bind still open when the unmount begins (as a
// child forked by another goroutine holds it until its exec) is unmounted once it is let go,
// without an error; one held past the patience fails with EBUSY, and stays mounted.
func TestAnUnmountWaitsForAMountHeldForAMoment(t *testing.T) {
	target := bindFile(t)
	f, err := os.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(target, 0); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("unmount of an open bind: %v, want EBUSY (the test holds nothing else)", err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		f.Close()
	}()
	if err := unmount(context.Background(), target, time.Minute); err != nil {
		t.Fatalf("unmount of a bind let go after 300 ms: %v", err)
	}
	if mounted, err := isMountPoint(target); err != nil || mounted {
		t.Fatalf("after the unmount: mounted %v, %v", mounted, err)
	}

	held := bindFile(t)
	g, err := os.Open(held)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := unmount(context.Background(), held, 200*time.Millisecond); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("unmount of a bind held past the patience: %v, want EBUSY", err)
	}
	if mounted, err := isMountPoint(held); err != nil || !mounted {
		t.Fatalf("a bind still held: mounted %v, %v; want it left mounted", mounted, err)
	}
}
