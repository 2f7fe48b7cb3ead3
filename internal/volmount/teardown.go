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
	detachLoop(ctx context.Context, dev string) error
	nbdConnected(dev string) bool
	disconnectNBD(dev string) error
	alive(p Process) bool
	signal(p Process, sig syscall.Signal) error
	sleep(d time.Duration)
	removeDir(dir string) error
}

// BusyError is a mount point that cannot be unmounted because something uses it.
type BusyError struct{ Dir string }

func (e *BusyError) Error() string {
	return fmt.Sprintf("%s is busy: a process has a file open there or works in it (fuser -vm %s lists them); stop it, then run replctl umount %s again", e.Dir, e.Dir, e.Dir)
}

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
	// loopReleaseTimeout is how long a detached loop device may take to let go of its file.
	loopReleaseTimeout = 10 * time.Second
	pollInterval       = 50 * time.Millisecond
)

// teardown undoes rec, in the reverse order of its setting up, each step only when what it
// undoes is there (so a second run, or a run after a half-done Mount, does what is left):
// unmount the file system (which writes it out and flushes the device), detach the loop
// device, stop the helper (a FUSE helper unmounts its file system, flushes and disconnects;
// a kernel one disconnects /dev/nbdN), clear what a helper that did not end cleanly left,
// and remove the record. It stops at the first step that fails, keeping the record.
func teardown(ctx context.Context, h host, reg Registry, rec *Record) error {
	mounts, err := h.mounts()
	if err != nil {
		return err
	}
	if m, ok := mountedOn(mounts, rec.Dir); ok && rec.Device != "" && m.Source == rec.Device {
		if err := h.unmount(rec.Dir, 0); err != nil {
			if errors.Is(err, syscall.EBUSY) {
				return &BusyError{Dir: rec.Dir}
			}
			return fmt.Errorf("unmount %s: %w", rec.Dir, err)
		}
	} else if ok && rec.Mounted {
		return fmt.Errorf("%s holds %s (%s), not %s, which replctl mount put there: unmount it first", rec.Dir, m.Source, m.FSType, rec.Device)
	}
	if rec.Loop != "" {
		backing, err := h.loopBacking(rec.Loop)
		if err != nil {
			return fmt.Errorf("loop device %s: %w", rec.Loop, err)
		}
		if backing != "" && backing == rec.File {
			if err := h.detachLoop(ctx, rec.Loop); err != nil {
				return fmt.Errorf("detach the loop device %s: %w", rec.Loop, err)
			}
			for waited := time.Duration(0); ; waited += pollInterval {
				if b, err := h.loopBacking(rec.Loop); err == nil && b != rec.File {
					break
				}
				if waited >= loopReleaseTimeout {
					return fmt.Errorf("the loop device %s still holds %s %s after it was detached", rec.Loop, rec.File, loopReleaseTimeout)
				}
				h.sleep(pollInterval)
			}
		}
	}
	if h.alive(rec.Helper) {
		if err := h.signal(rec.Helper, syscall.SIGTERM); err != nil {
			return fmt.Errorf("stop the helper (process %d): %w", rec.Helper.PID, err)
		}
		if !waitGone(h, rec.Helper, helperStopTimeout) {
			_ = h.signal(rec.Helper, syscall.SIGKILL)
			if !waitGone(h, rec.Helper, 5*time.Second) {
				return fmt.Errorf("the helper (process %d) does not exit, even killed", rec.Helper.PID)
			}
		}
	}
	if rec.Via == ViaKernel && strings.HasPrefix(rec.Device, "/dev/nbd") && h.nbdConnected(rec.Device) {
		if err := h.disconnectNBD(rec.Device); err != nil {
			return fmt.Errorf("disconnect %s: %w", rec.Device, err)
		}
	}
	if rec.FUSEDir != "" {
		mounts, err := h.mounts()
		if err != nil {
			return err
		}
		if _, ok := mountedOn(mounts, rec.FUSEDir); ok {
			if err := h.unmount(rec.FUSEDir, 0); err != nil {
				if err := h.unmount(rec.FUSEDir, syscall.MNT_DETACH); err != nil {
					return fmt.Errorf("unmount the FUSE file system %s: %w", rec.FUSEDir, err)
				}
			}
		}
		if err := h.removeDir(rec.FUSEDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return reg.Remove(rec.Dir)
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
// a mount replctl mount did not make; a *BusyError when something uses the file system (the
// record is kept: run it again once that stopped).
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
