package main

// Throttled disks for the read-balancing phase: each node's backing file
// behind its own loop device, and each node's replnode in its own cgroup
// whose read bandwidth on that device is capped (cgroup v2 io.max rbps,
// or cgroup v1 blkio.throttle.read_bps_device). The cap applies to what
// reaches the device, so the page cache is dropped before every run.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ---------------------------------------------------------------------------
// loop devices

type loopDev struct {
	path string   // /dev/loopN
	file string   // the backing file
	f    *os.File // held open: with autoclear, the device goes when the last opener closes
}

// attachLoop puts file behind a free loop device (losetup) and sets it to
// detach itself once nobody holds it open, so that it does not outlive
// this process even if it is killed.
func attachLoop(ctx context.Context, file string) (*loopDev, error) {
	out, err := exec.CommandContext(ctx, "losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("losetup --find --show %s: %v: %s", file, err, strings.TrimSpace(string(out)))
	}
	l := &loopDev{path: strings.TrimSpace(string(out)), file: file}
	if l.f, err = os.OpenFile(l.path, os.O_RDONLY, 0); err != nil {
		l.detach()
		return nil, err
	}
	if info, err := unix.IoctlLoopGetStatus64(int(l.f.Fd())); err == nil {
		info.Flags |= unix.LO_FLAGS_AUTOCLEAR
		if err := unix.IoctlLoopSetStatus64(int(l.f.Fd()), info); err != nil {
			logf("read balancing: %s: autoclear not set (%v); it is detached at the end", l.path, err)
		}
	}
	return l, nil
}

// devNum is the device's "MAJ:MIN".
func devNum(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", fmt.Errorf("%s is not a block device", path)
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)), nil
}

// dropCache writes back and drops the device's page cache (BLKFLSBUF).
func (l *loopDev) dropCache() error {
	if err := unix.IoctlSetInt(int(l.f.Fd()), unix.BLKFLSBUF, 0); err != nil {
		return fmt.Errorf("%s: BLKFLSBUF: %w", l.path, err)
	}
	return nil
}

// ours reports whether the device still serves our backing file.
func (l *loopDev) ours() bool {
	data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(l.path), "loop", "backing_file"))
	return err == nil && strings.HasPrefix(strings.TrimSpace(string(data)), l.file)
}

// detach closes our handle (autoclear then detaches the device when no
// one else holds it) and detaches the device if it still serves our file.
// Call it after the processes that use the device are gone.
func (l *loopDev) detach() {
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	for i := 0; i < 20 && l.ours(); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if l.ours() {
		if out, err := exec.Command("losetup", "-d", l.path).CombinedOutput(); err != nil && l.ours() {
			logf("cleanup: losetup -d %s: %v: %s", l.path, err, strings.TrimSpace(string(out)))
		}
	}
}

// ---------------------------------------------------------------------------
// cgroups

// ioThrottle is one cgroup per node, each capping the reads of that node's
// device.
type ioThrottle struct {
	kind string            // what it is, for the report
	v2   bool              // cgroup v2 io.max; else v1 blkio
	dirs map[string]string // node -> its cgroup
	devs map[string]string // node -> "MAJ:MIN" of its device
	// v2: our parent cgroup, and the subtree_control we added io to (to
	// take it out again).
	parent    string
	ioEnabled string
}

// throttleSupport says how reads can be capped per process group here, or
// why they cannot.
func throttleSupport() (v2root string, v1root string, why error) {
	if os.Geteuid() != 0 {
		return "", "", errors.New("needs root (loop devices and cgroups)")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		return "", "", errors.New("losetup not found")
	}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		data, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
		if err == nil && strings.Contains(" "+strings.TrimSpace(string(data))+" ", " io ") {
			return root, "", nil
		}
	}
	v1 := "/sys/fs/cgroup/blkio"
	if _, err := os.Stat(filepath.Join(v1, "blkio.throttle.read_bps_device")); err == nil {
		return "", v1, nil
	}
	return "", "", errors.New("no cgroup v2 io controller and no cgroup v1 blkio throttle on this machine")
}

// newIOThrottle makes one cgroup per node in devs, capping reads of the
// node's device at bps bytes per second.
func newIOThrottle(tag string, devs map[string]string, bps int64) (t *ioThrottle, err error) {
	v2root, v1root, why := throttleSupport()
	if why != nil {
		return nil, why
	}
	t = &ioThrottle{dirs: map[string]string{}, devs: devs}
	defer func() {
		if err != nil {
			t.remove()
		}
	}()
	if v2root != "" {
		t.v2 = true
		t.kind = "cgroup v2 io.max rbps"
		sub := filepath.Join(v2root, "cgroup.subtree_control")
		data, err := os.ReadFile(sub)
		if err != nil {
			return nil, err
		}
		if !strings.Contains(" "+strings.TrimSpace(string(data))+" ", " io ") {
			if err := os.WriteFile(sub, []byte("+io"), 0); err != nil {
				return nil, fmt.Errorf("enable io in %s: %w", sub, err)
			}
			t.ioEnabled = sub
		}
		t.parent = filepath.Join(v2root, tag)
		if err := os.Mkdir(t.parent, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(t.parent, "cgroup.subtree_control"), []byte("+io"), 0); err != nil {
			return nil, fmt.Errorf("enable io in %s: %w", t.parent, err)
		}
		for node, dev := range devs {
			dir := filepath.Join(t.parent, node)
			if err := os.Mkdir(dir, 0o755); err != nil {
				return nil, err
			}
			t.dirs[node] = dir
			if err := os.WriteFile(filepath.Join(dir, "io.max"), []byte(fmt.Sprintf("%s rbps=%d", dev, bps)), 0); err != nil {
				return nil, fmt.Errorf("%s: io.max: %w", dir, err)
			}
		}
		return t, nil
	}
	t.kind = "cgroup v1 blkio.throttle.read_bps_device"
	for node, dev := range devs {
		dir := filepath.Join(v1root, tag+"-"+node)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, err
		}
		t.dirs[node] = dir
		if err := os.WriteFile(filepath.Join(dir, "blkio.throttle.read_bps_device"), []byte(fmt.Sprintf("%s %d", dev, bps)), 0); err != nil {
			return nil, fmt.Errorf("%s: blkio.throttle.read_bps_device: %w", dir, err)
		}
	}
	return t, nil
}

// join moves process pid (all its threads) into node's cgroup.
func (t *ioThrottle) join(node string, pid int) error {
	if err := os.WriteFile(filepath.Join(t.dirs[node], "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("move pid %d into %s: %w", pid, t.dirs[node], err)
	}
	return nil
}

// readBytes is what node's cgroup has read from its device so far.
func (t *ioThrottle) readBytes(node string) (int64, error) {
	dev := t.devs[node]
	if t.v2 {
		data, err := os.ReadFile(filepath.Join(t.dirs[node], "io.stat"))
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != dev {
				continue
			}
			for _, kv := range f[1:] {
				if v, ok := strings.CutPrefix(kv, "rbytes="); ok {
					return strconv.ParseInt(v, 10, 64)
				}
			}
		}
		return 0, nil // no IO yet
	}
	data, err := os.ReadFile(filepath.Join(t.dirs[node], "blkio.throttle.io_service_bytes"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == dev && f[1] == "Read" {
			return strconv.ParseInt(f[2], 10, 64)
		}
	}
	return 0, nil
}

// remove deletes the cgroups; their processes must be gone.
func (t *ioThrottle) remove() {
	if t == nil {
		return
	}
	for node, dir := range t.dirs {
		var err error
		for i := 0; i < 20; i++ { // a process that just exited may linger a moment
			if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			logf("cleanup: remove cgroup %s: %v", dir, err)
			continue
		}
		delete(t.dirs, node)
	}
	if t.parent != "" {
		if err := os.Remove(t.parent); err != nil && !errors.Is(err, os.ErrNotExist) {
			logf("cleanup: remove cgroup %s: %v", t.parent, err)
		}
		t.parent = ""
	}
	if t.ioEnabled != "" {
		// Best effort: another cgroup may have come to use io meanwhile.
		_ = os.WriteFile(t.ioEnabled, []byte("-io"), 0)
		t.ioEnabled = ""
	}
}
