package volmount

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"time"
)

// host is what tearing down does to the machine; tests give a fake that records it.
type host interface {
	mounts() ([]mountEntry, error)
	// unmount unmounts dir (umount2(2) with flags: 0, or MNT_DETACH).
	unmount(dir string, flags int) error
	// loopBacking is the file behind a loop device, "" when it has none.
	loopBacking(dev string) (string, error)
	// deviceUsers is who else uses a block device: its mounts (but one on except), the
	// devices stacked on it and the processes that hold it open, in every mount namespace.
	deviceUsers(dev, except string) (deviceUsers, error)
	detachLoop(ctx context.Context, dev string) error
	nbdConnected(dev string) bool
	disconnectNBD(dev string) error
	alive(p Process) bool
	signal(p Process, sig syscall.Signal) error
	sleep(d time.Duration)
	removeDir(dir string) error
}

// deviceUsers is who uses a block device besides the mount being undone.
type deviceUsers struct {
	// Mounts: where it is mounted ("DIR", "DIR in the mount namespace of process N").
	Mounts []string
	// Holders: the devices stacked on it (dm-0, md1).
	Holders []string
	// Processes: those that hold it open ("process 812 (systemd-udevd)").
	Processes []string
}

func (u deviceUsers) none() bool {
	return len(u.Mounts) == 0 && len(u.Holders) == 0 && len(u.Processes) == 0
}

// String says who they are.
func (u deviceUsers) String() string {
	var parts []string
	if len(u.Mounts) > 0 {
		parts = append(parts, "mounted on "+strings.Join(u.Mounts, ", "))
	}
	if len(u.Holders) > 0 {
		parts = append(parts, "under "+strings.Join(u.Holders, ", "))
	}
	if len(u.Processes) > 0 {
		parts = append(parts, "open by "+strings.Join(u.Processes, ", "))
	}
	if len(parts) == 0 {
		return "used by nothing this host shows"
	}
	return strings.Join(parts, "; ")
}

// BusyError is a mount point that cannot be unmounted because something uses it.
type BusyError struct{ Dir string }

func (e *BusyError) Error() string {
	return fmt.Sprintf("%s is busy: a process has a file open there or works in it (fuser -vm %s lists them); stop it, then run replctl umount %s again", e.Dir, e.Dir, e.Dir)
}

// LoopInUseError is a loop device that something besides the mount uses (a mount of it
// elsewhere, a device over it, a process that keeps it open), so that it cannot be detached.
type LoopInUseError struct {
	Loop  string
	Users deviceUsers
	// Waited is how long processes holding it were waited for.
	Waited time.Duration
}

func (e *LoopInUseError) Error() string {
	if len(e.Users.Mounts) > 0 || len(e.Users.Holders) > 0 {
		return fmt.Sprintf("the loop device %s is %s: a file system or a device there would lose its disk; unmount or remove it first", e.Loop, e.Users)
	}
	return fmt.Sprintf("the loop device %s is still %s after %s (fuser -v %s lists them): stop them first", e.Loop, e.Users, e.Waited, e.Loop)
}

// StepError is a step of undoing a mount that failed: what is left of the mount, and how to
// finish (the record is kept).
type StepError struct {
	Dir string
	// Step is what was being done ("detach the loop device /dev/loop3").
	Step string
	Err  error
	// Left is what of the mount is still there.
	Left []string
}

func (e *StepError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "replctl umount %s stopped at: %s: %v", e.Dir, e.Step, e.Err)
	if len(e.Left) > 0 {
		fmt.Fprintf(&b, ". Left: %s", strings.Join(e.Left, "; "))
	}
	if busy := (*BusyError)(nil); !errors.As(e.Err, &busy) {
		fmt.Fprintf(&b, ". Once that is dealt with, run replctl umount %s again to finish", e.Dir)
	}
	return b.String()
}

func (e *StepError) Unwrap() error { return e.Err }

// NotOursError is a mount point replctl mount did not set up.
type NotOursError struct {
	Dir, Source, FSType string
}

func (e *NotOursError) Error() string {
	return fmt.Sprintf("%s was not mounted by replctl mount (it holds %s, %s, and there is no record of it): unmount it with umount(8)", e.Dir, e.Source, e.FSType)
}

// Waits of the teardown.
const (
	// helperStopTimeout is how long the helper has to flush, disconnect and exit after
	// SIGTERM before it is killed.
	helperStopTimeout = 20 * time.Second
	// loopUsersTimeout is how long processes that hold the loop device open (a probe:
	// udev's blkid, lsblk) are waited for before it is detached; the helper serves their
	// reads meanwhile.
	loopUsersTimeout = 30 * time.Second
	// loopReleaseTimeout is how long a detached loop device may take to let go of its file.
	loopReleaseTimeout = 10 * time.Second
	pollInterval       = 50 * time.Millisecond
)

// teardown undoes rec, in the reverse order of its setting up, each step only when what it
// undoes is there (so a second run, or a run after a half-done Mount, does what is left):
// unmount the file system (which writes it out and flushes the device), detach the loop
// device once nothing else uses it, stop the helper (a FUSE helper unmounts its file
// system, flushes and disconnects; a kernel one disconnects /dev/nbdN), clear what a helper
// that did not end cleanly left, and remove the record. It stops at the first step that
// fails, keeping the record, with a *StepError that says what is left.
func teardown(ctx context.Context, h host, reg Registry, rec *Record) error {
	if step, err := undo(ctx, h, rec); err != nil {
		return &StepError{Dir: rec.Dir, Step: step, Err: err, Left: leftOf(h, reg, rec)}
	}
	if err := reg.Remove(rec.Dir); err != nil {
		return &StepError{Dir: rec.Dir, Step: "remove the record", Err: err, Left: leftOf(h, reg, rec)}
	}
	return nil
}

// undo does teardown's steps; on a failure it names the step.
func undo(ctx context.Context, h host, rec *Record) (step string, err error) {
	mounts, err := h.mounts()
	if err != nil {
		return "read the mount table", err
	}
	if m, ok := mountedOn(mounts, rec.Dir); ok && rec.Device != "" && m.Source == rec.Device {
		if err := h.unmount(rec.Dir, 0); err != nil {
			if errors.Is(err, syscall.EBUSY) {
				return "unmount the file system", &BusyError{Dir: rec.Dir}
			}
			return "unmount the file system", fmt.Errorf("unmount %s: %w", rec.Dir, err)
		}
	} else if ok && rec.Mounted {
		return "unmount the file system", fmt.Errorf("%s holds %s (%s), not %s, which replctl mount put there: unmount it first", rec.Dir, m.Source, m.FSType, rec.Device)
	}
	if rec.Loop != "" {
		step := "detach the loop device " + rec.Loop
		backing, err := h.loopBacking(rec.Loop)
		if err != nil {
			return step, fmt.Errorf("loop device %s: %w", rec.Loop, err)
		}
		if backing != "" && backing == rec.File {
			// Nothing else may use the device when it is detached: a detach of a device in
			// use only marks it to let go of its file at its last close (autoclear), and
			// its users, not this step, would decide when.
			if err := waitUnused(h, rec.Loop, rec.Dir); err != nil {
				return step, err
			}
			if err := h.detachLoop(ctx, rec.Loop); err != nil {
				return step, fmt.Errorf("losetup --detach %s: %w", rec.Loop, err)
			}
			for waited := time.Duration(0); ; waited += pollInterval {
				if b, err := h.loopBacking(rec.Loop); err == nil && b != rec.File {
					break
				}
				if waited >= loopReleaseTimeout {
					// Something opened it between the look and the detach.
					users, _ := h.deviceUsers(rec.Loop, rec.Dir)
					return step, fmt.Errorf("the loop device %s still holds %s %s after it was detached: it is %s; it lets go of the file when they close it", rec.Loop, rec.File, loopReleaseTimeout, users)
				}
				h.sleep(pollInterval)
			}
		}
	}
	if h.alive(rec.Helper) {
		step := fmt.Sprintf("stop the helper (process %d)", rec.Helper.PID)
		if err := h.signal(rec.Helper, syscall.SIGTERM); err != nil {
			return step, err
		}
		if !waitGone(h, rec.Helper, helperStopTimeout) {
			_ = h.signal(rec.Helper, syscall.SIGKILL)
			if !waitGone(h, rec.Helper, 5*time.Second) {
				return step, errors.New("it does not exit, even killed")
			}
		}
	}
	if rec.Via == ViaKernel && strings.HasPrefix(rec.Device, "/dev/nbd") && h.nbdConnected(rec.Device) {
		if err := h.disconnectNBD(rec.Device); err != nil {
			return "disconnect " + rec.Device, err
		}
	}
	if rec.FUSEDir != "" {
		step := "unmount the FUSE file system " + rec.FUSEDir
		mounts, err := h.mounts()
		if err != nil {
			return step, err
		}
		if _, ok := mountedOn(mounts, rec.FUSEDir); ok {
			if err := h.unmount(rec.FUSEDir, 0); err != nil {
				if err := h.unmount(rec.FUSEDir, syscall.MNT_DETACH); err != nil {
					return step, err
				}
			}
		}
		if err := h.removeDir(rec.FUSEDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "remove the directory " + rec.FUSEDir, err
		}
	}
	return "", nil
}

// waitUnused returns once nothing but the mount on except uses the block device dev: at
// once, with a *LoopInUseError, when it is mounted elsewhere or a device is stacked on it;
// after loopUsersTimeout when processes still hold it open.
func waitUnused(h host, dev, except string) error {
	for waited := time.Duration(0); ; waited += pollInterval {
		users, err := h.deviceUsers(dev, except)
		if err != nil {
			return fmt.Errorf("who uses %s: %w", dev, err)
		}
		switch {
		case users.none():
			return nil
		case len(users.Mounts) > 0 || len(users.Holders) > 0:
			return &LoopInUseError{Loop: dev, Users: users}
		case waited >= loopUsersTimeout:
			return &LoopInUseError{Loop: dev, Users: users, Waited: waited}
		}
		h.sleep(pollInterval)
	}
}

// leftOf lists what of rec's mount is still there, for a StepError.
func leftOf(h host, reg Registry, rec *Record) []string {
	var left []string
	mounts, _ := h.mounts()
	if m, ok := mountedOn(mounts, rec.Dir); ok && rec.Device != "" && m.Source == rec.Device {
		left = append(left, fmt.Sprintf("the file system (%s on %s) mounted at %s", m.FSType, m.Source, rec.Dir))
	}
	if rec.Loop != "" {
		if b, err := h.loopBacking(rec.Loop); err == nil && b != "" && b == rec.File {
			left = append(left, fmt.Sprintf("the loop device %s over %s", rec.Loop, rec.File))
		}
	}
	if rec.Via == ViaKernel && strings.HasPrefix(rec.Device, "/dev/nbd") && h.nbdConnected(rec.Device) {
		left = append(left, "the NBD device "+rec.Device)
	}
	if rec.FUSEDir != "" {
		if _, ok := mountedOn(mounts, rec.FUSEDir); ok {
			left = append(left, "the FUSE mount at "+rec.FUSEDir)
		}
	}
	if h.alive(rec.Helper) {
		left = append(left, fmt.Sprintf("the helper, process %d (its log: %s)", rec.Helper.PID, reg.LogPath(rec.Dir)))
	}
	if rec.Claim != nil {
		node := rec.Claim.Node
		if node == "" {
			node = "the primary"
		}
		left = append(left, fmt.Sprintf("the volume's claim on %s (%s is mounted at most once)", node, rec.Volume))
	}
	return append(left, "the record "+reg.recordPath(rec.Dir))
}

func waitGone(h host, p Process, within time.Duration) bool {
	for waited := time.Duration(0); h.alive(p); waited += pollInterval {
		if waited >= within {
			return false
		}
		h.sleep(pollInterval)
	}
	return true
}

// Unmount undoes what Mount set up on dir (absolute, symbolic links resolved). It returns the
// record of what it undid, nil when nothing was mounted there; a *NotOursError when dir holds
// a mount replctl mount did not make; a *StepError when a step fails, which says what is left
// and keeps the record (run it again once the cause is gone): a *BusyError when something
// uses the file system, a *LoopInUseError when something else uses the loop device. It gives
// no claim back: the caller does, once it returned no error.
func Unmount(ctx context.Context, reg Registry, dir string) (*Record, error) {
	return unmountWith(ctx, realHost{}, reg, dir)
}

func unmountWith(ctx context.Context, h host, reg Registry, dir string) (*Record, error) {
	rec, err := reg.Load(dir)
	if errors.Is(err, ErrNoRecord) {
		mounts, err := h.mounts()
		if err != nil {
			return nil, err
		}
		if m, ok := mountedOn(mounts, dir); ok {
			return nil, &NotOursError{Dir: dir, Source: m.Source, FSType: m.FSType}
		}
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return rec, teardown(ctx, h, reg, rec)
}

// realHost is this machine.
type realHost struct{}

func (realHost) mounts() ([]mountEntry, error) { return readMounts() }

func (realHost) unmount(dir string, flags int) error { return syscall.Unmount(dir, flags) }

func (realHost) loopBacking(dev string) (string, error) {
	b, err := os.ReadFile("/sys/block/" + strings.TrimPrefix(dev, "/dev/") + "/loop/backing_file")
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil // no file behind it (the loop directory exists only while one is)
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)"), nil
}

func (realHost) deviceUsers(dev, except string) (deviceUsers, error) {
	return blockDeviceUsers(dev, except)
}

func (realHost) detachLoop(ctx context.Context, dev string) error {
	_, err := runTool(ctx, "losetup", "--detach", dev)
	return err
}

func (realHost) nbdConnected(dev string) bool { return nbdConnected(dev) }

func (realHost) disconnectNBD(dev string) error { return disconnectNBD(dev) }

func (realHost) alive(p Process) bool { return p.Alive() }

func (realHost) signal(p Process, sig syscall.Signal) error { return p.Signal(sig) }

func (realHost) sleep(d time.Duration) { time.Sleep(d) }

func (realHost) removeDir(dir string) error { return os.Remove(dir) }
