package volmount

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// FSTypes are the file systems Mount makes with MakeFS.
var FSTypes = []string{"ext4", "xfs"}

// Request is one mount: Volume's export at URI, on Dir.
type Request struct {
	// Dir is the mount point: absolute, symbolic links resolved, an existing directory.
	Dir    string
	Volume string
	URI    string
	// TLSDir holds the NBD client's certificate, for an nbds:// URI.
	TLSDir string
	Via    Via
	// FSType is the file system to mount or make ("": the one found; ext4 to make).
	FSType string
	// MakeFS makes a file system first; Force lets it replace one the device holds.
	MakeFS, Force bool
	// Options are mount(8)'s -o options ("" for none).
	Options string
	// Connections and IOTimeout are the helper's (HelperConfig).
	Connections int
	IOTimeout   time.Duration
	// Helper is the command line that runs RunHelper, the helper's arguments appended
	// (replctl's: its own executable and its hidden mount-helper command).
	Helper []string
	// Registry keeps the record.
	Registry Registry
	// Claim and Claimer: the volume's claim on its primary, and who asks for it (nil: no
	// claim is asked for). Mount fills in the claim's ID (a new one, or the record's when
	// it mounts again from a record whose helper is gone) and Host when empty.
	Claim   *Claim
	Claimer Claimer
	// Follow makes the helper follow the volume's primary through Controls, the cluster's
	// control addresses (Record.Follow); it needs FUSE.
	Follow   bool
	Controls []string
	// RefreshEvery is how often a FUSE helper, following or not, asks whether the export
	// grew (HelperConfig.RefreshEvery; 0: DefaultRefreshEvery).
	RefreshEvery time.Duration
	// Attach stops once the block device is there: no file system is probed, made or mounted
	// (replctl attach); Dir is AttachKey(Volume).
	Attach bool
}

// ClaimAction is what a Claimer is asked to do with a mount's claim.
type ClaimAction string

// The claim actions (transport.ClaimTake, ClaimConfirm, ClaimRelease).
const (
	ClaimTake    ClaimAction = "take"
	ClaimConfirm ClaimAction = "confirm"
	ClaimRelease ClaimAction = "release"
)

// Claimer asks the volume's primary about the claim of rec (rec.Claim, for rec.Volume and
// rec.Dir): take it, confirm it, or give it back. An error is the primary's refusal, in
// words, or why it could not be asked.
type Claimer interface {
	Claim(ctx context.Context, action ClaimAction, rec *Record) error
}

// newClaimID is a claim's ID: 16 random hex digits.
func newClaimID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("a claim ID: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// HasFileSystemError: MakeFS without Force on a device that holds a file system.
type HasFileSystemError struct {
	Volume, Device, FSType string
}

func (e *HasFileSystemError) Error() string {
	return fmt.Sprintf("%s already holds a file system (%s on %s): --mkfs would destroy it; mount it without --mkfs, or add --force to make a new one and lose what it holds", e.Volume, e.FSType, e.Device)
}

// NoFileSystemError: a device without a file system and no MakeFS.
type NoFileSystemError struct{ Volume string }

func (e *NoFileSystemError) Error() string {
	return fmt.Sprintf("%s holds no file system: add --mkfs to make one (ext4, or --fstype xfs)", e.Volume)
}

// helperReadyTimeout bounds the helper's start: it connects (dialTimeout) and mounts FUSE.
const helperReadyTimeout = dialTimeout + 30*time.Second

// Mount attaches req's export and mounts its file system on req.Dir, recording every step;
// when a step fails, what was done is undone. It returns the record.
//
// With a Claimer, the record is saved with the claim BEFORE the claim is taken (so that
// Unmount finds it whatever happens next), the claim is taken BEFORE the helper connects to
// the export, and confirmed once it is connected, BEFORE any file system is probed, made or
// mounted: a volume another mount holds is refused before anything is set up, --force or
// not. A record of req.Dir whose helper is gone (it crashed, or was killed) is a mount to make
// again: what is left of it is undone, and the claim is taken again with the record's ID,
// which the primary knows as the same mount's.
func Mount(ctx context.Context, req Request) (*Record, error) {
	haveNBD := haveDevice("/dev/nbd0")
	if req.Follow {
		// The kernel's nbd driver holds the connections itself: only the FUSE helper can
		// send what was not answered again.
		if req.Via == ViaKernel {
			return nil, errors.New("--follow needs --via fuse (or auto): the kernel's nbd driver holds its connections itself and cannot send again what the old primary did not answer")
		}
		haveNBD = false
	}
	via, err := chooseVia(req.Via, haveNBD, haveDevice("/dev/fuse"))
	if err != nil {
		return nil, err
	}
	if !req.Attach {
		fi, err := os.Stat(req.Dir)
		if err != nil {
			return nil, fmt.Errorf("mount point: %w", err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("mount point %s is not a directory", req.Dir)
		}
	}
	var claim *Claim
	if req.Claimer != nil {
		c := Claim{}
		if req.Claim != nil {
			c = *req.Claim
		}
		claim = &c
	}
	old, err := req.Registry.Load(req.Dir)
	switch {
	case errors.Is(err, ErrNoRecord):
	case err != nil:
		return nil, err
	case old.Volume != req.Volume || old.Helper.Stays():
		return nil, fmt.Errorf("%s: %w (%s; run replctl umount %s first)", req.Dir, ErrAlreadyMounted, old.Volume, req.Dir)
	default:
		// Its helper is gone (or killed and on its way out: teardown waits for it): what is
		// left of that mount is undone, and the claim is the record's.
		if err := teardown(ctx, realHost{}, req.Registry, old); err != nil {
			return nil, fmt.Errorf("%s was mounted by replctl mount and its helper (process %d) is gone; undoing what is left of it, to mount it again, failed: %w", req.Dir, old.Helper.PID, err)
		}
		if claim != nil && old.Claim != nil {
			claim.ID = old.Claim.ID
		}
	}
	mounts, err := readMounts()
	if err != nil {
		return nil, err
	}
	if m, ok := mountedOn(mounts, req.Dir); ok {
		return nil, fmt.Errorf("%s is already a mount point (%s, %s): unmount it first, or choose another directory", req.Dir, m.Source, m.FSType)
	}
	if claim != nil {
		if claim.ID == "" {
			if claim.ID, err = newClaimID(); err != nil {
				return nil, err
			}
		}
		if claim.Host == "" {
			if claim.Host, err = os.Hostname(); err != nil {
				return nil, fmt.Errorf("this host's name, for the claim: %w", err)
			}
		}
	}
	rec := &Record{Dir: req.Dir, Volume: req.Volume, Export: req.URI, Via: via, Created: time.Now().UTC(), Claim: claim,
		Follow: req.Follow, Controls: req.Controls, Attached: req.Attach}
	if err := req.Registry.Create(rec); err != nil {
		return nil, fmt.Errorf("%w (run replctl umount %s first)", err, req.Dir)
	}
	if claim != nil {
		if err := req.Claimer.Claim(ctx, ClaimTake, rec); err != nil {
			// Nothing was set up: the record goes.
			if rerr := req.Registry.Remove(req.Dir); rerr != nil {
				return nil, fmt.Errorf("%w; and removing the record failed (%v): run replctl umount %s", err, rerr, req.Dir)
			}
			return nil, err
		}
	}
	if err := setUp(ctx, req, rec); err != nil {
		// Undo with a context of its own: ctx may be what ended.
		undoCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if uerr := teardown(undoCtx, realHost{}, req.Registry, rec); uerr != nil {
			return nil, fmt.Errorf("%w; undoing what was set up failed too: %v", err, uerr)
		}
		if claim != nil {
			if rerr := req.Claimer.Claim(undoCtx, ClaimRelease, rec); rerr != nil {
				return nil, fmt.Errorf("%w; everything set up was undone, but the claim was not given back (%v): it lapses by itself once the mount's connections are closed for %s", err, rerr, claimGrace(claim))
			}
		}
		return nil, err
	}
	return rec, nil
}

// claimGrace is how long a claim lasts after its connections closed, in words.
func claimGrace(c *Claim) string {
	if c == nil || c.Grace <= 0 {
		return "a minute"
	}
	return c.Grace.String()
}

// setUp does Mount's steps, saving rec after each.
func setUp(ctx context.Context, req Request, rec *Record) error {
	reg := req.Registry
	cfg := HelperConfig{Via: rec.Via, URI: req.URI, TLSDir: req.TLSDir, Connections: req.Connections, IOTimeout: req.IOTimeout}
	if rec.Via == ViaFUSE {
		// Following or not, the helper asks whether the export grew, and says so there.
		cfg.FollowingPath, cfg.RefreshEvery = reg.FollowingPath(req.Dir), req.RefreshEvery
	}
	if req.Follow {
		cfg.Follow, cfg.Volume, cfg.Controls = true, req.Volume, req.Controls
		if rec.Claim != nil {
			cfg.ClaimID, cfg.ClaimHost, cfg.ClaimDir = rec.Claim.ID, rec.Claim.Host, req.Dir
		}
	}
	if rec.Via == ViaFUSE {
		cfg.FUSEDir, cfg.Name = reg.FUSEDir(req.Dir), req.Volume
		if err := os.Mkdir(cfg.FUSEDir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		rec.FUSEDir = cfg.FUSEDir
	}
	r, err := startHelper(ctx, req, cfg, rec)
	if err != nil {
		return err
	}
	rec.File, rec.Device, rec.Connections = r.File, r.Device, r.Connections
	if err := reg.Save(rec); err != nil {
		return err
	}
	// The helper's connections are made: the claim must still be this mount's BEFORE
	// anything reads, makes or mounts a file system.
	if rec.Claim != nil && req.Claimer != nil {
		if err := req.Claimer.Claim(ctx, ClaimConfirm, rec); err != nil {
			return err
		}
	}
	if rec.Via == ViaFUSE {
		// The loop device is set up here, never in the helper: the process that serves the
		// file must not wait on the device over it.
		out, err := runTool(ctx, "losetup", "--find", "--show", rec.File)
		if err != nil {
			return err
		}
		rec.Loop = strings.TrimSpace(out)
		rec.Device = rec.Loop
		if err := reg.Save(rec); err != nil {
			return err
		}
	}
	if req.Attach {
		return nil
	}
	found, err := probeFS(ctx, rec.Device)
	if err != nil {
		return err
	}
	fstype := found
	switch {
	case req.MakeFS:
		if found != "" && !req.Force {
			return &HasFileSystemError{Volume: req.Volume, Device: rec.Device, FSType: found}
		}
		fstype = req.FSType
		if fstype == "" {
			fstype = "ext4"
		}
		if err := makeFS(ctx, fstype, rec.Device, req.Force); err != nil {
			return err
		}
	case found == "":
		return &NoFileSystemError{Volume: req.Volume}
	case req.FSType != "" && req.FSType != found:
		return fmt.Errorf("%s holds %s, not %s: drop --fstype to mount it as it is, or --mkfs --force to make %s and lose what it holds", req.Volume, found, req.FSType, req.FSType)
	}
	rec.FSType = fstype
	if err := reg.Save(rec); err != nil {
		return err
	}
	args := []string{"-t", fstype}
	if req.Options != "" {
		args = append(args, "-o", req.Options)
	}
	if _, err := runTool(ctx, "mount", append(args, rec.Device, req.Dir)...); err != nil {
		return err
	}
	rec.Mounted = true
	return reg.Save(rec)
}

// startHelper starts the helper process, detached (a session of its own, its output in the
// record's log), and waits for its ready message.
func startHelper(ctx context.Context, req Request, cfg HelperConfig, rec *Record) (ready, error) {
	if len(req.Helper) == 0 {
		return ready{}, errors.New("no helper command")
	}
	logPath := req.Registry.LogPath(req.Dir)
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return ready{}, err
	}
	defer logFile.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return ready{}, err
	}
	defer pr.Close()
	cmd := exec.Command(req.Helper[0], append(append([]string(nil), req.Helper[1:]...), cfg.Args()...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.ExtraFiles = []*os.File{pw} // its file descriptor 3 (readyFD)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	err = cmd.Start()
	pw.Close()
	if err != nil {
		return ready{}, fmt.Errorf("start the helper: %w", err)
	}
	if p, err := processOf(cmd.Process.Pid); err == nil {
		rec.Helper = p
	} else {
		rec.Helper = Process{PID: cmd.Process.Pid}
	}
	// Reap it when it ends, should this process outlive it.
	go func() { _ = cmd.Wait() }()
	if err := req.Registry.Save(rec); err != nil {
		return ready{}, err
	}
	type answer struct {
		r   ready
		err error
	}
	got := make(chan answer, 1)
	go func() {
		b, err := io.ReadAll(io.LimitReader(pr, 64<<10))
		var r ready
		if err == nil {
			if len(bytes.TrimSpace(b)) == 0 {
				err = errors.New("the helper ended without saying why")
			} else {
				err = json.Unmarshal(b, &r)
			}
		}
		got <- answer{r, err}
	}()
	timer := time.NewTimer(helperReadyTimeout)
	defer timer.Stop()
	select {
	case a := <-got:
		switch {
		case a.err != nil:
			return ready{}, fmt.Errorf("the helper: %v (its log: %s)", a.err, tail(logPath))
		case a.r.Error != "":
			return ready{}, errors.New(a.r.Error)
		}
		return a.r, nil
	case <-timer.C:
		return ready{}, fmt.Errorf("the helper was not ready after %s (its log: %s)", helperReadyTimeout, tail(logPath))
	case <-ctx.Done():
		return ready{}, ctx.Err()
	}
}

// tail is the end of a log file, for an error message.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return path
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 800 {
		s = "..." + s[len(s)-800:]
	}
	if s == "" {
		return path + ", empty"
	}
	return s
}

// probeFS is the type of file system on device ("" when blkid finds none).
func probeFS(ctx context.Context, device string) (string, error) {
	out, err := runTool(ctx, "blkid", "--probe", "--output", "value", "--match-tag", "TYPE", device)
	var te *ToolError
	if errors.As(err, &te) && te.Code == 2 {
		return "", nil // blkid: nothing found
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}

// makeFS makes an fstype file system on device; force lets mkfs overwrite one (Mount checked
// that the user asked for it).
func makeFS(ctx context.Context, fstype, device string, force bool) error {
	var args []string
	switch fstype {
	case "ext4":
		args = []string{"-q", "-F"}
	case "xfs":
		args = []string{"-q"}
		if force {
			args = append(args, "-f")
		}
	default:
		return fmt.Errorf("--fstype %q: replctl mount makes %s", fstype, strings.Join(FSTypes, " or "))
	}
	_, err := runTool(ctx, "mkfs."+fstype, append(args, device)...)
	return err
}
