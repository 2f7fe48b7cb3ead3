package volmount

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/mounttree"
	"github.com/replvol/replvol/internal/poll"
)

// TestBlockDeviceUsersFindsTheProcessesAndMountsOfALoopDevice: a real loop device is used by
// nothing, then by a process that holds it open, then by a mount of its file system; each is
// named, and a mount on the directory being undone is not.
func TestBlockDeviceUsersFindsTheProcessesAndMountsOfALoopDevice(t *testing.T) {
	needRoot(t, "losetup", "mkfs.ext4", "mount")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 16<<20); err != nil {
		t.Fatal(err)
	}
	out, err := runTool(ctx, "losetup", "--find", "--show", img)
	if err != nil {
		t.Fatal(err)
	}
	loop := strings.TrimSpace(out)
	t.Cleanup(func() { _ = exec.Command("losetup", "--detach", loop).Run() })
	if u, err := blockDeviceUsers(loop, ""); err != nil || !u.none() {
		t.Fatalf("an unused loop device: %+v, %v", u, err)
	}

	holder := exec.Command("sh", "-c", fmt.Sprintf("exec 3<%s; echo ready; exec sleep 600", loop))
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	if _, err := stdout.Read(make([]byte, 6)); err != nil {
		t.Fatal(err)
	}
	// "ready" comes from the shell before it execs sleep: the process is
	// named sleep once the exec is done.
	var u deviceUsers
	want := fmt.Sprintf("process %d (sleep)", holder.Process.Pid)
	if !poll.Within(10*time.Second, 10*time.Millisecond, func() bool {
		u, err = blockDeviceUsers(loop, "")
		return err == nil && slices.Contains(u.Processes, want)
	}) || len(u.Mounts) != 0 {
		t.Fatalf("a loop device a process holds open: %+v, %v; want %s among its processes", u, err, want)
	}
	_ = holder.Process.Kill()
	_ = holder.Wait()

	if _, err := runTool(ctx, "mkfs.ext4", "-q", "-F", loop); err != nil {
		t.Fatal(err)
	}
	// Under a shared tree: a namespace another test makes meanwhile (ip netns exec) holds no
	// copy of the mount once it is unmounted.
	dir := filepath.Join(mounttree.Shared(t), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := runTool(ctx, "mount", "-t", "ext4", loop, dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	if u, err := blockDeviceUsers(loop, ""); err != nil || !slices.Contains(u.Mounts, dir) {
		t.Fatalf("a mounted loop device: %+v, %v; want %s among its mounts", u, err, dir)
	}
	if u, err := blockDeviceUsers(loop, dir); err != nil || !u.none() {
		t.Fatalf("a loop device mounted only on the directory being undone: %+v, %v; want no other user", u, err)
	}
}
