package volmount

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// blockDeviceUsers finds who uses the block device dev besides a mount of it on except (in
// this process's mount namespace): its mounts in every mount namespace (each namespace's
// mount table read once), the devices stacked on it (sysfs holders), and the processes other
// than this one with a file descriptor on it (/proc/PID/fd). A process that ends while it is
// looked at is skipped.
func blockDeviceUsers(dev, except string) (deviceUsers, error) {
	var u deviceUsers
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return u, fmt.Errorf("stat %s: %w", dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return u, fmt.Errorf("%s is not a block device", dev)
	}
	rdev := uint64(st.Rdev)
	devNum := fmt.Sprintf("%d:%d", unix.Major(rdev), unix.Minor(rdev))
	if holders, err := os.ReadDir(filepath.Join("/sys/block", filepath.Base(dev), "holders")); err == nil {
		for _, h := range holders {
			u.Holders = append(u.Holders, h.Name())
		}
	}
	selfNS, _ := os.Readlink("/proc/self/ns/mnt")
	mounts, err := readMounts()
	if err != nil {
		return u, err
	}
	for _, m := range mounts {
		if m.Dev == devNum && m.Dir != except {
			u.Mounts = append(u.Mounts, m.Dir)
		}
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return u, err
	}
	seenNS := map[string]bool{selfNS: true}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		dir := filepath.Join("/proc", p.Name())
		if ns, err := os.Readlink(filepath.Join(dir, "ns", "mnt")); err == nil && !seenNS[ns] {
			seenNS[ns] = true
			if f, err := os.Open(filepath.Join(dir, "mountinfo")); err == nil {
				mounts, _ := parseMountinfo(f)
				f.Close()
				for _, m := range mounts {
					if m.Dev == devNum {
						u.Mounts = append(u.Mounts, fmt.Sprintf("%s in the mount namespace of %s", m.Dir, processName(pid)))
					}
				}
			}
		}
		if holdsOpen(dir, rdev) {
			u.Processes = append(u.Processes, processName(pid))
		}
	}
	sort.Strings(u.Mounts)
	return u, nil
}

// holdsOpen says whether the process at dir (/proc/PID) has a file descriptor on the block
// device rdev.
func holdsOpen(dir string, rdev uint64) bool {
	fds, err := os.ReadDir(filepath.Join(dir, "fd"))
	if err != nil {
		return false // gone, or not ours to read
	}
	for _, fd := range fds {
		path := filepath.Join(dir, "fd", fd.Name())
		target, err := os.Readlink(path)
		if err != nil || !strings.HasPrefix(target, "/") {
			continue // sockets, pipes, anonymous inodes
		}
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFBLK && uint64(st.Rdev) == rdev {
			return true
		}
	}
	return false
}

// processName is "process PID (COMMAND)", or "process PID" when its name cannot be read.
func processName(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return fmt.Sprintf("process %d", pid)
	}
	return fmt.Sprintf("process %d (%s)", pid, strings.TrimSpace(string(b)))
}
