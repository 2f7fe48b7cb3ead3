package volmount

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// DefaultRunDir is where records of what replctl mount set up are kept: under /run, so that
// they go with a reboot, as the mounts do.
const DefaultRunDir = "/run/replvol/mounts"

// Via is how an export is attached.
type Via string

// The ways of attaching an export.
const (
	// ViaAuto: the kernel's nbd driver when /dev/nbd0 exists, FUSE otherwise.
	ViaAuto Via = "auto"
	// ViaKernel: /dev/nbdN, through the kernel's nbd driver.
	ViaKernel Via = "kernel"
	// ViaFUSE: a file served through FUSE, on a loop device.
	ViaFUSE Via = "fuse"
)

// Record is what was set up for one mount point, saved after every step, so that Unmount
// undoes what exists even when Mount stopped half way.
type Record struct {
	// Dir is the mount point: absolute, symbolic links resolved.
	Dir    string `json:"dir"`
	Volume string `json:"volume"`
	// Export is the NBD URI the helper connected to.
	Export string `json:"export"`
	Via    Via    `json:"via"`
	// Helper is the process that is the NBD client (and the FUSE server).
	Helper Process `json:"helper,omitzero"`
	// FUSEDir is the FUSE file system's mount point and File the export as a file in it
	// (ViaFUSE); Loop the loop device over File.
	FUSEDir string `json:"fuse_dir,omitempty"`
	File    string `json:"file,omitempty"`
	Loop    string `json:"loop,omitempty"`
	// Connections is how many NBD connections the helper holds.
	Connections int `json:"connections,omitempty"`
	// Device is the block device mounted on Dir: Loop, or /dev/nbdN.
	Device string `json:"device,omitempty"`
	FSType string `json:"fstype,omitempty"`
	// Mounted: the file system was mounted on Dir.
	Mounted bool      `json:"mounted"`
	Created time.Time `json:"created"`
	// Claim is the mount's claim on the volume's primary (nil: none was
	// asked for), saved BEFORE it is taken, so that umount gives it back
	// whatever step Mount stopped at.
	Claim *Claim `json:"claim,omitempty"`
	// Follow: the helper follows the primary (replctl mount --follow): when the primary dies
	// or hands over it finds the new one through Controls, the cluster's control addresses,
	// takes the claim there under the same ID and sends what was not answered again. The
	// server it serves from now is in the run directory's Following file.
	Follow   bool     `json:"follow,omitempty"`
	Controls []string `json:"controls,omitempty"`
	// Attached: replctl attach made it, a block device without a file system; Dir is then
	// AttachKey(Volume), not a directory.
	Attached bool `json:"attached,omitempty"`
}

// AttachKey is the record's Dir of replctl attach VOLUME.
func AttachKey(volume string) string { return "/replctl-attach/" + volume }

// Following is where a following helper serves its export from now: it writes it each time
// it connects, BEFORE it sends anything on the connection. A helper that does not follow
// writes its refreshes there too (Size, Refreshed, RefreshError), with no Primary or Control.
type Following struct {
	// Primary is the node, Control its control address, Export the NBD URI.
	Primary string    `json:"primary"`
	Control string    `json:"control,omitempty"`
	Export  string    `json:"export"`
	Since   time.Time `json:"since"`
	// Size is the export's size the helper serves, as its last refresh found it (at
	// Refreshed; RefreshError says why that refresh could not tell).
	Size         int64     `json:"size,omitempty"`
	Refreshed    time.Time `json:"refreshed,omitzero"`
	RefreshError string    `json:"refresh_error,omitempty"`
}

// Claim is a mount's claim on its volume: the primary keeps it, so that the
// volume is mounted at most once, on any host (transport.ClaimRequest).
type Claim struct {
	// ID is the claim's, made at the first Mount on Dir and kept when the
	// mount is made again from its record; Host is this host's name.
	ID   string `json:"id"`
	Host string `json:"host"`
	// Node is the primary that holds it, Addr the control address
	// replctl mount reached it at (--addr) and TLSDir its --tls-dir:
	// replctl umount gives the claim back there.
	Node   string `json:"node,omitempty"`
	Addr   string `json:"addr"`
	TLSDir string `json:"tls_dir,omitempty"`
	// Grace is how long the claim lasts after the mount's connections
	// closed: its --io-timeout.
	Grace time.Duration `json:"grace,omitempty"`
}

// Registry keeps the records of a run directory.
type Registry struct {
	// Dir is the run directory (DefaultRunDir).
	Dir string
}

// ErrAlreadyMounted: a record exists for the mount point.
var ErrAlreadyMounted = errors.New("already mounted by replctl mount")

// ErrNoRecord: no record exists for the mount point.
var ErrNoRecord = errors.New("not mounted by replctl mount")

// key names a mount point's files in the run directory.
func key(dir string) string {
	return url.PathEscape(strings.TrimPrefix(filepath.Clean(dir), "/"))
}

func (r Registry) recordPath(dir string) string { return filepath.Join(r.Dir, key(dir)+".json") }

// LogPath is where the helper of dir's mount writes its log.
func (r Registry) LogPath(dir string) string { return filepath.Join(r.Dir, key(dir)+".log") }

// FollowingPath is where the helper of dir's mount says which server it follows now.
func (r Registry) FollowingPath(dir string) string {
	return filepath.Join(r.Dir, key(dir)+".following")
}

// Following reads what the helper of dir's mount follows now (nil, nil: it wrote nothing).
func (r Registry) Following(dir string) (*Following, error) {
	b, err := os.ReadFile(r.FollowingPath(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f Following
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", r.FollowingPath(dir), err)
	}
	return &f, nil
}

// SaveFollowing replaces the Following file at path, atomically.
func SaveFollowing(path string, f Following) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// FUSEDir is the FUSE mount point for dir's mount.
func (r Registry) FUSEDir(dir string) string { return filepath.Join(r.Dir, key(dir)+".fuse") }

// Create saves rec as a new record; ErrAlreadyMounted when one exists for its Dir.
func (r Registry) Create(rec *Record) error {
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	f, err := os.OpenFile(r.recordPath(rec.Dir), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s: %w", rec.Dir, ErrAlreadyMounted)
	}
	if err != nil {
		return err
	}
	f.Close()
	return r.Save(rec)
}

// Save replaces rec's record, atomically.
func (r Registry) Save(rec *Record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	path := r.recordPath(rec.Dir)
	tmp, err := os.CreateTemp(r.Dir, ".record-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Load reads dir's record; ErrNoRecord when there is none.
func (r Registry) Load(dir string) (*Record, error) {
	b, err := os.ReadFile(r.recordPath(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", dir, ErrNoRecord)
	}
	if err != nil {
		return nil, err
	}
	var rec Record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("the record of %s (%s) is damaged: %v; remove it once nothing of the mount is left", dir, r.recordPath(dir), err)
	}
	return &rec, nil
}

// Remove deletes dir's record and its helper's log.
func (r Registry) Remove(dir string) error {
	os.Remove(r.LogPath(dir))
	os.Remove(r.FollowingPath(dir))
	if err := os.Remove(r.recordPath(dir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// List returns every record.
func (r Registry) List() ([]*Record, error) {
	entries, err := os.ReadDir(r.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Record
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			continue
		}
		dir, err := url.PathUnescape(strings.TrimSuffix(name, ".json"))
		if err != nil {
			continue
		}
		rec, err := r.Load("/" + dir)
		if err != nil {
			return out, err
		}
		out = append(out, rec)
	}
	return out, nil
}

// ErrNoRefresh: Refresh of a mount through the kernel's nbd driver, which keeps the size it
// was given at the connect.
var ErrNoRefresh = errors.New("the kernel's nbd driver keeps the size it was given: unmount (or detach) and attach again to see the volume grow")

// Refresh asks the helper of dir's mount (through FUSE, following the primary or not) to find
// out now whether the export grew, and waits until it answered, within ctx: on a SIGHUP the
// helper asks the server, and when the export grew it grows its file and the loop device's
// capacity. It returns what the helper says then (Following.Size, and RefreshError when it
// could not tell).
func (r Registry) Refresh(ctx context.Context, dir string) (*Following, error) {
	rec, err := r.Load(dir)
	if err != nil {
		return nil, err
	}
	if rec.Via != ViaFUSE {
		return nil, fmt.Errorf("%s: %w", dir, ErrNoRefresh)
	}
	if !rec.Helper.Alive() {
		return nil, fmt.Errorf("%s: the helper process %d is gone: unmount (or detach) and attach again", dir, rec.Helper.PID)
	}
	before, err := r.Following(dir)
	if err != nil {
		return nil, err
	}
	if err := rec.Helper.Signal(syscall.SIGHUP); err != nil {
		return nil, fmt.Errorf("signal the helper %d: %w", rec.Helper.PID, err)
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		now, err := r.Following(dir)
		if err != nil {
			return nil, err
		}
		if now != nil && (before == nil || now.Refreshed.After(before.Refreshed)) {
			return now, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: the helper did not answer the refresh (its log: %s): %w", dir, r.LogPath(dir), ctx.Err())
		case <-tick.C:
		}
	}
}
