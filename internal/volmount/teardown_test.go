package volmount

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeHost is a machine in memory that logs what is done to it.
type fakeHost struct {
	table   map[string]mountEntry // mount point -> what is mounted
	loops   map[string]string     // loop device -> backing file
	nbd     map[string]bool       // nbd device -> connected
	helper  Process
	running bool
	// ignoresTERM: the helper does not exit on SIGTERM; leavesFUSE: when it dies it leaves
	// its FUSE file system mounted (killed).
	ignoresTERM, leavesFUSE bool
	fuseDir                 string
	busy                    map[string]bool
	// usedBy uses the loop devices for the next usedFor looks at them (-1: for ever).
	usedBy  deviceUsers
	usedFor int
	log     []string
}

func (h *fakeHost) deviceUsers(dev, except string) (deviceUsers, error) {
	if h.usedFor == 0 {
		return deviceUsers{}, nil
	}
	if h.usedFor > 0 {
		h.usedFor--
	}
	return h.usedBy, nil
}

func (h *fakeHost) mounts() ([]mountEntry, error) {
	var out []mountEntry
	for _, m := range h.table {
		out = append(out, m)
	}
	return out, nil
}

func (h *fakeHost) unmount(dir string, flags int) error {
	h.log = append(h.log, fmt.Sprintf("umount %s %d", dir, flags))
	if h.busy[dir] && flags == 0 {
		return syscall.EBUSY
	}
	if _, ok := h.table[dir]; !ok {
		return syscall.EINVAL
	}
	delete(h.table, dir)
	return nil
}

func (h *fakeHost) loopBacking(dev string) (string, error) { return h.loops[dev], nil }

func (h *fakeHost) detachLoop(_ context.Context, dev string) error {
	h.log = append(h.log, "losetup -d "+dev)
	delete(h.loops, dev)
	return nil
}

func (h *fakeHost) nbdConnected(dev string) bool { return h.nbd[dev] }

func (h *fakeHost) disconnectNBD(dev string) error {
	h.log = append(h.log, "disconnect "+dev)
	h.nbd[dev] = false
	return nil
}

func (h *fakeHost) alive(p Process) bool { return h.running && p == h.helper }

func (h *fakeHost) signal(p Process, sig syscall.Signal) error {
	h.log = append(h.log, "signal "+sig.String())
	if !h.alive(p) || (sig == syscall.SIGTERM && h.ignoresTERM) {
		return nil
	}
	h.running = false
	if sig == syscall.SIGTERM || !h.leavesFUSE {
		delete(h.table, h.fuseDir) // it unmounts its own file system
	}
	for dev := range h.nbd {
		if sig == syscall.SIGTERM {
			h.nbd[dev] = false // it disconnects
		}
	}
	return nil
}

func (h *fakeHost) sleep(time.Duration) {}

func (h *fakeHost) removeDir(dir string) error {
	h.log = append(h.log, "rmdir "+dir)
	return nil
}

// fuseSetUp is a whole FUSE mount of vol0 on /srv/data, its record saved in reg.
func fuseSetUp(t *testing.T, reg Registry) (*fakeHost, *Record) {
	t.Helper()
	helper := Process{PID: 4242, Start: 99}
	rec := &Record{Dir: "/srv/data", Volume: "vol0", Via: ViaFUSE, Helper: helper,
		FUSEDir: reg.FUSEDir("/srv/data"), File: reg.FUSEDir("/srv/data") + "/vol0",
		Loop: "/dev/loop3", Device: "/dev/loop3", FSType: "ext4", Mounted: true}
	if err := reg.Create(rec); err != nil {
		t.Fatal(err)
	}
	h := &fakeHost{
		table: map[string]mountEntry{
			"/srv/data": {Dir: "/srv/data", Source: "/dev/loop3", FSType: "ext4"},
			rec.FUSEDir: {Dir: rec.FUSEDir, Source: "replvol:vol0", FSType: "fuse.replvol"},
		},
		loops: map[string]string{"/dev/loop3": rec.File}, nbd: map[string]bool{},
		helper: helper, running: true, fuseDir: rec.FUSEDir, busy: map[string]bool{},
	}
	return h, rec
}

// TestUnmountUndoesInOrderAndOnlyOnce: the file system, then the loop device, then the
// helper (which unmounts FUSE, flushes and disconnects), then the FUSE directory and the
// record; a second umount finds nothing to do.
func TestUnmountUndoesInOrderAndOnlyOnce(t *testing.T) {
	reg := Registry{Dir: t.TempDir()}
	h, rec := fuseSetUp(t, reg)
	got, err := unmountWith(context.Background(), h, reg, "/srv/data")
	if err != nil || got == nil {
		t.Fatalf("Unmount: %v, %v", got, err)
	}
	want := []string{"umount /srv/data 0", "losetup -d /dev/loop3", "signal terminated", "rmdir " + rec.FUSEDir}
	if !reflect.DeepEqual(h.log, want) {
		t.Fatalf("done:\n got %q\nwant %q", h.log, want)
	}
	if len(h.table) != 0 || len(h.loops) != 0 || h.running {
		t.Fatalf("left: mounts %v, loops %v, helper running %v", h.table, h.loops, h.running)
	}
	if _, err := reg.Load("/srv/data"); !errors.Is(err, ErrNoRecord) {
		t.Fatalf("the record after Unmount: %v", err)
	}
	h.log = nil
	if got, err := unmountWith(context.Background(), h, reg, "/srv/data"); err != nil || got != nil || len(h.log) != 0 {
		t.Fatalf("a second Unmount: %v, %v, did %q; want nothing done", got, err, h.log)
	}
}

// TestUnmountOfABusyFileSystemKeepsEverything: a file system in use is not unmounted lazily:
// the error says so and what to do, nothing else is undone, and the next umount finishes.
func TestUnmountOfABusyFileSystemKeepsEverything(t *testing.T) {
	reg := Registry{Dir: t.TempDir()}
	h, _ := fuseSetUp(t, reg)
	h.busy["/srv/data"] = true
	_, err := unmountWith(context.Background(), h, reg, "/srv/data")
	var busy *BusyError
	if !errors.As(err, &busy) || busy.Dir != "/srv/data" {
		t.Fatalf("Unmount of a busy file system: %v, want a BusyError", err)
	}
	if len(h.loops) != 1 || !h.running {
		t.Fatalf("a busy umount undid more: %q", h.log)
	}
	if _, err := reg.Load("/srv/data"); err != nil {
		t.Fatalf("the record after a busy umount: %v", err)
	}
	h.busy["/srv/data"] = false
	if _, err := unmountWith(context.Background(), h, reg, "/srv/data"); err != nil {
		t.Fatalf("Unmount once it is no longer busy: %v", err)
	}
}

// TestUnmountFinishesAHalfDoneMount: Mount stopped after the loop device (the mkfs failed,
// say): what exists is undone, what does not is skipped.
func TestUnmountFinishesAHalfDoneMount(t *testing.T) {
	reg := Registry{Dir: t.TempDir()}
	h, rec := fuseSetUp(t, reg)
	delete(h.table, "/srv/data")
	rec.Mounted = false
	if err := reg.Save(rec); err != nil {
		t.Fatal(err)
	}
	if _, err := unmountWith(context.Background(), h, reg, "/srv/data"); err != nil {
		t.Fatal(err)
	}
	want := []string{"losetup -d /dev/loop3", "signal terminated", "rmdir " + rec.FUSEDir}
	if !reflect.DeepEqual(h.log, want) {
		t.Fatalf("done %q, want %q", h.log, want)
	}
}

// TestAHelperThatDoesNotStopIsKilledAndItsFUSEUnmounted: a helper deaf to SIGTERM is killed
// after the wait, and the FUSE file system it leaves is unmounted.
func TestAHelperThatDoesNotStopIsKilledAndItsFUSEUnmounted(t *testing.T) {
	reg := Registry{Dir: t.TempDir()}
	h, rec := fuseSetUp(t, reg)
	h.ignoresTERM, h.leavesFUSE = true, true
	if _, err := unmountWith(context.Background(), h, reg, "/srv/data"); err != nil {
		t.Fatal(err)
	}
	want := []string{"umount /srv/data 0", "losetup -d /dev/loop3", "signal terminated", "signal killed", fmt.Sprintf("umount %s 0", rec.FUSEDir), "rmdir " + rec.FUSEDir}
	if !reflect.DeepEqual(h.log, want) || len(h.table) != 0 {
		t.Fatalf("done %q (left %v), want %q", h.log, h.table, want)
	}
}

// TestALoopDeviceReusedByAnotherFileIsLeftAlone: a loop device whose file is no longer the
// export's (it was detached and taken by someone else) is not detached.
func TestALoopDeviceReusedByAnotherFileIsLeftAlone(t *testing.T) {
	reg := Registry{Dir: t.TempDir()}
	h, _ := fuseSetUp(t, reg)
	delete(h.table, "/srv/data")
	h.loops["/dev/loop3"] = "/var/lib/images/other.img"
	if _, err := unmountWith(context.Background(), h, reg, "/srv/data"); err != nil {
		t.Fatal(err)
	}
	if h.loops["/dev/loop3"] != "/var/lib/images/other.img" {
		t.Fatalf("someone else's loop device was detached: %q", h.log)
	}
}

// TestAKernelDeviceIsDisconnectedEvenWhenItsHelperDied: the kernel path's helper disconnects
// /dev/nbdN on SIGTERM; when it is gone, Unmount disconnects the device itself.
func TestAKernelDeviceIsDisconnectedEvenWhenItsHelperDied(t *testing.T) {
	reg := Registry{Dir: t.TempDir()}
	rec := &Record{Dir: "/srv/data", Volume: "vol0", Via: ViaKernel, Helper: Process{PID: 1, Start: 1}, Device: "/dev/nbd0", FSType: "xfs", Mounted: true}
	if err := reg.Create(rec); err != nil {
		t.Fatal(err)
	}
	h := &fakeHost{table: map[string]mountEntry{"/srv/data": {Dir: "/srv/data", Source: "/dev/nbd0", FSType: "xfs"}},
		loops: map[string]string{}, nbd: map[string]bool{"/dev/nbd0": true}, busy: map[string]bool{}}
	if _, err := unmountWith(context.Background(), h, reg, "/srv/data"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"umount /srv/data 0", "disconnect /dev/nbd0"}; !reflect.DeepEqual(h.log, want) {
		t.Fatalf("done %q, want %q", h.log, want)
	}
}

// TestUnmountRefusesWhatItDidNotMount: a mount point without a record that holds a file
// system is refused, naming it; a directory that holds nothing is nothing to do.
func TestUnmountRefusesWhatItDidNotMount(t *testing.T) {
	reg := Registry{Dir: t.TempDir()}
	h := &fakeHost{table: map[string]mountEntry{"/home": {Dir: "/home", Source: "/dev/sda2", FSType: "ext4"}}}
	_, err := unmountWith(context.Background(), h, reg, "/home")
	var notOurs *NotOursError
	if !errors.As(err, &notOurs) || notOurs.Source != "/dev/sda2" {
		t.Fatalf("Unmount of /home: %v, want a NotOursError", err)
	}
	if len(h.log) != 0 {
		t.Fatalf("did %q to a mount it did not make", h.log)
	}
	if rec, err := unmountWith(context.Background(), h, reg, "/srv/empty"); rec != nil || err != nil {
		t.Fatalf("Unmount of an empty directory: %v, %v", rec, err)
	}
}

// TestUnmountRefusesWhenTheMountPointHoldsSomethingElse: something mounted over the volume's
// file system after replctl mount is not unmounted in its place.
func TestUnmountRefusesWhenTheMountPointHoldsSomethingElse(t *testing.T) {
	reg := Registry{Dir: t.TempDir()}
	h, _ := fuseSetUp(t, reg)
	h.table["/srv/data"] = mountEntry{Dir: "/srv/data", Source: "tmpfs", FSType: "tmpfs"}
	if _, err := unmountWith(context.Background(), h, reg, "/srv/data"); err == nil || len(h.log) != 0 {
		t.Fatalf("Unmount over another mount: %v, did %q", err, h.log)
	}
}

// TestAFailedStepSaysWhatIsLeftAndHowToFinish: the file system is unmounted, but a process
// keeps the loop device open past the wait (as udev's probe might, or anything that opened
// it): the loop device is not detached half way (a detach of a device in use only marks it
// to let go at its last close), the helper its reader needs keeps serving, and the error
// names the step, who holds the device, everything that is left and the command that
// finishes the job. Once the process is gone, that command does.
func TestAFailedStepSaysWhatIsLeftAndHowToFinish(t *testing.T) {
	reg := Registry{Dir: t.TempDir()}
	h, rec := fuseSetUp(t, reg)
	h.usedBy, h.usedFor = deviceUsers{Processes: []string{"process 812 (systemd-udevd)"}}, -1
	_, err := unmountWith(context.Background(), h, reg, "/srv/data")
	var step *StepError
	var inUse *LoopInUseError
	if !errors.As(err, &step) || !errors.As(err, &inUse) {
		t.Fatalf("Unmount with the loop device held open: %v; want a StepError of a LoopInUseError", err)
	}
	for _, words := range []string{
		"replctl umount /srv/data stopped at: detach the loop device /dev/loop3",
		"the loop device /dev/loop3 is still open by process 812 (systemd-udevd) after 30s",
		"Left: the loop device /dev/loop3 over " + rec.File,
		"the FUSE mount at " + rec.FUSEDir,
		"the helper, process 4242 (its log: " + reg.LogPath("/srv/data") + ")",
		"the record " + reg.recordPath("/srv/data"),
		"run replctl umount /srv/data again to finish",
	} {
		if !strings.Contains(err.Error(), words) {
			t.Errorf("the error does not say %q:\n%s", words, err)
		}
	}
	if strings.Contains(err.Error(), "the file system (ext4") {
		t.Errorf("the error counts the file system, which was unmounted, as left: %s", err)
	}
	if want := []string{"umount /srv/data 0"}; !reflect.DeepEqual(h.log, want) {
		t.Fatalf("done %q, want only %q: nothing detached or stopped while the device is in use", h.log, want)
	}
	if _, err := reg.Load("/srv/data"); err != nil {
		t.Fatalf("the record after a failed step: %v", err)
	}

	h.usedFor, h.log = 0, nil
	if _, err := unmountWith(context.Background(), h, reg, "/srv/data"); err != nil {
		t.Fatalf("replctl umount again once the process is gone: %v", err)
	}
	if want := []string{"losetup -d /dev/loop3", "signal terminated", "rmdir " + rec.FUSEDir}; !reflect.DeepEqual(h.log, want) {
		t.Fatalf("the second run did %q, want %q", h.log, want)
	}
}

// TestAProbeOfTheLoopDeviceIsWaitedForBeforeTheDetach: a process that holds the loop device
// open for a moment (a probe) is waited for, the helper serving meanwhile; the device is
// detached once nothing uses it, and the teardown goes on.
func TestAProbeOfTheLoopDeviceIsWaitedForBeforeTheDetach(t *testing.T) {
	reg := Registry{Dir: t.TempDir()}
	h, rec := fuseSetUp(t, reg)
	h.usedBy, h.usedFor = deviceUsers{Processes: []string{"process 77 (blkid)"}}, 40 // 2 s of looks
	if _, err := unmountWith(context.Background(), h, reg, "/srv/data"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"umount /srv/data 0", "losetup -d /dev/loop3", "signal terminated", "rmdir " + rec.FUSEDir}; !reflect.DeepEqual(h.log, want) {
		t.Fatalf("done %q, want %q", h.log, want)
	}
}

// TestALoopDeviceMountedElsewhereIsNotDetached: the loop device also mounted elsewhere (a
// copy of the mount in another mount namespace) is refused at once, naming where: a
// detach would leave that file system without its disk.
func TestALoopDeviceMountedElsewhereIsNotDetached(t *testing.T) {
	reg := Registry{Dir: t.TempDir()}
	h, _ := fuseSetUp(t, reg)
	h.usedBy, h.usedFor = deviceUsers{Mounts: []string{"/srv/data in the mount namespace of process 900 (backup)"}}, -1
	_, err := unmountWith(context.Background(), h, reg, "/srv/data")
	if err == nil || !strings.Contains(err.Error(), "the loop device /dev/loop3 is mounted on /srv/data in the mount namespace of process 900 (backup)") {
		t.Fatalf("Unmount with the loop device mounted elsewhere: %v", err)
	}
	if len(h.log) != 1 || !h.running {
		t.Fatalf("done %q: want only the file system unmounted here", h.log)
	}
}
