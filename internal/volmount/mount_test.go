package volmount

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/mounttree"
	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/transport/nbd"
)

// helperEnv makes this test binary the helper process: Mount runs it again with it set.
const helperEnv = "VOLMOUNT_TEST_RUN_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(RunHelper(os.Args[1:], nil))
	}
	os.Exit(m.Run())
}

// fileExport is an export over a sparse file that counts its flushes.
type fileExport struct {
	f       *os.File
	flushes *atomic.Int64
}

func (e fileExport) Size() int64 {
	fi, err := e.f.Stat()
	if err != nil {
		return 0
	}
	return fi.Size()
}
func (e fileExport) ReadAt(_ context.Context, p []byte, off int64) error {
	_, err := e.f.ReadAt(p, off)
	return err
}
func (e fileExport) WriteAt(_ context.Context, p []byte, off int64, fua bool) error {
	if _, err := e.f.WriteAt(p, off); err != nil {
		return err
	}
	if fua {
		return e.f.Sync()
	}
	return nil
}
func (e fileExport) WriteZeroes(_ context.Context, off, length int64, _ bool) error {
	return syscall.Fallocate(int(e.f.Fd()), 0x03, off, length) // PUNCH_HOLE | KEEP_SIZE
}
func (e fileExport) Trim(ctx context.Context, off, length int64) error {
	return e.WriteZeroes(ctx, off, length, false)
}
func (e fileExport) Flush(context.Context) error {
	e.flushes.Add(1)
	return e.f.Sync()
}

type oneExport struct {
	name string
	e    nbd.Export
}

func (r oneExport) Lookup(name string) (nbd.Export, error) {
	if name != r.name {
		return nil, fmt.Errorf("%s: no such volume", name)
	}
	return r.e, nil
}
func (r oneExport) List() []string { return []string{r.name} }

// needRoot skips (or under CI=true fails) a test that mounts.
func needRoot(t *testing.T, tools ...string) {
	t.Helper()
	why := ""
	switch {
	case os.Geteuid() != 0:
		why = "it mounts file systems: run it as root"
	case !haveDevice("/dev/fuse"):
		why = "no /dev/fuse"
	}
	for _, tool := range tools {
		if _, err := lookTool(tool); err != nil && why == "" {
			why = err.Error()
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: %s", why)
	}
	t.Skip(why)
}

// tlsExport serves a size-byte sparse file as export vol0 over NBD with TLS required, and
// returns its nbds:// URI, the directory replctl certs init would have written and the count
// of flushes that reached it.
func tlsExport(t *testing.T, size int64) (uri, tlsDir string, flushes *atomic.Int64) {
	t.Helper()
	tlsDir = t.TempDir()
	alpha := pki.Holder{Identity: pki.Identity{Role: pki.RoleNode, Name: "alpha"}, Hosts: []string{"127.0.0.1"}}
	if _, err := pki.Init(tlsDir, []pki.Holder{alpha}, false); err != nil {
		t.Fatal(err)
	}
	server, err := pki.Load(filepath.Join(tlsDir, pki.CAFile), filepath.Join(tlsDir, "alpha.crt"), filepath.Join(tlsDir, "alpha.key"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "vol0.img"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	flushes = new(atomic.Int64)
	srv := nbd.NewServer(nbd.Config{Resolver: oneExport{"vol0", fileExport{f, flushes}},
		TLS: server.ServerConfig(true, pki.Roles(pki.RoleNBDClient, pki.RoleOperator)), TLSPolicy: nbd.TLSRequired})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return "nbds://" + l.Addr().String() + "/vol0", tlsDir, flushes
}

// cleanUpAfter undoes whatever the test leaves in reg, even when it failed half way.
func cleanUpAfter(t *testing.T, reg Registry) {
	t.Cleanup(func() {
		recs, _ := reg.List()
		for _, rec := range recs {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if _, err := Unmount(ctx, reg, rec.Dir); err != nil {
				t.Errorf("cleanup: %v; forcing", err)
				_ = syscall.Unmount(rec.Dir, syscall.MNT_DETACH)
				if rec.Loop != "" {
					_ = exec.Command("losetup", "-d", rec.Loop).Run()
				}
				_ = rec.Helper.Signal(syscall.SIGKILL)
				_ = syscall.Unmount(rec.FUSEDir, syscall.MNT_DETACH)
			}
			cancel()
		}
	})
}

// requireNothingLeft fails the test if anything rec set up is still there.
func requireNothingLeft(t *testing.T, reg Registry, rec *Record) {
	t.Helper()
	mounts, err := readMounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{rec.Dir, rec.FUSEDir} {
		if m, ok := mountedOn(mounts, dir); ok {
			t.Errorf("%s is still mounted (%s, %s)", dir, m.Source, m.FSType)
		}
	}
	if rec.Loop != "" {
		if b, _ := (realHost{}).loopBacking(rec.Loop); b == rec.File {
			t.Errorf("%s still holds %s", rec.Loop, rec.File)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for rec.Helper.Alive() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // reaped by Mount's goroutine
	}
	if rec.Helper.Alive() {
		t.Errorf("the helper (process %d) still runs", rec.Helper.PID)
	}
	if _, err := os.Stat(rec.FUSEDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the FUSE directory %s is still there (%v)", rec.FUSEDir, err)
	}
	if _, err := reg.Load(rec.Dir); !errors.Is(err, ErrNoRecord) {
		t.Errorf("the record of %s is still there (%v)", rec.Dir, err)
	}
}

// TestMountOverFUSEMakesWritesAndUnmountsEverything: an NBD export over TLS (the cluster's
// nbd-client certificate) is mounted through the FUSE helper and a loop device, ext4 and xfs
// each made by --mkfs; files written survive umount and a second mount; the refusals leave
// nothing behind: a mount point already mounted, --mkfs over a file system without --force,
// and a device without a file system and no --mkfs.
func TestMountOverFUSEMakesWritesAndUnmountsEverything(t *testing.T) {
	needRoot(t, "losetup", "blkid", "mount", "mkfs.ext4", "mkfs.xfs")
	t.Setenv(helperEnv, "1")
	// xfs needs 300 MiB at least.
	uri, tlsDir, flushes := tlsExport(t, 320<<20)
	// Under a shared tree: a namespace another test makes meanwhile (ip netns exec) holds
	// no copy of these mounts once they are unmounted here.
	tree := mounttree.Shared(t)
	reg := Registry{Dir: filepath.Join(tree, "run")}
	cleanUpAfter(t, reg)
	dir := filepath.Join(tree, "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req := Request{Dir: dir, Volume: "vol0", URI: uri, TLSDir: tlsDir, Via: ViaFUSE, Connections: 4,
		IOTimeout: time.Minute, Helper: []string{os.Args[0]}, Registry: reg}

	// No file system yet, and no --mkfs.
	_, err := Mount(ctx, req)
	var none *NoFileSystemError
	if !errors.As(err, &none) {
		t.Fatalf("mount of an empty volume without --mkfs: %v, want NoFileSystemError", err)
	}
	requireNothingLeft(t, reg, &Record{Dir: dir, FUSEDir: reg.FUSEDir(dir)})

	data := make([]byte, 3<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	for _, fstype := range []string{"ext4", "xfs"} {
		t.Run(fstype, func(t *testing.T) {
			mk := req
			mk.MakeFS, mk.FSType, mk.Force = true, fstype, fstype == "xfs" // xfs replaces the ext4
			rec, err := Mount(ctx, mk)
			if err != nil {
				t.Fatalf("mount --mkfs --fstype %s: %v", fstype, err)
			}
			if rec.Via != ViaFUSE || rec.Loop == "" || rec.Device != rec.Loop || !rec.Mounted || rec.FSType != fstype || !rec.Helper.Alive() || rec.Connections != 4 {
				t.Fatalf("record %+v", rec)
			}
			mounts, _ := readMounts()
			if m, ok := mountedOn(mounts, dir); !ok || m.FSType != fstype || m.Source != rec.Loop {
				t.Fatalf("%s holds %+v", dir, m)
			}
			if _, err := Mount(ctx, req); !errors.Is(err, ErrAlreadyMounted) {
				t.Fatalf("a second mount on %s: %v, want ErrAlreadyMounted", dir, err)
			}
			if err := os.WriteFile(filepath.Join(dir, "data.bin"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			before := flushes.Load()
			if _, err := Unmount(ctx, reg, dir); err != nil {
				t.Fatalf("umount: %v", err)
			}
			requireNothingLeft(t, reg, rec)
			// The file system's last writes reach the export as NBD flushes.
			if flushes.Load() == before {
				t.Fatal("umount sent no flush to the export")
			}
			if again, err := Unmount(ctx, reg, dir); again != nil || err != nil {
				t.Fatalf("a second umount: %v, %v; want nothing to do", again, err)
			}

			rec, err = Mount(ctx, req)
			if err != nil {
				t.Fatalf("mount again: %v", err)
			}
			if rec.FSType != fstype {
				t.Fatalf("mounted %s, want %s", rec.FSType, fstype)
			}
			got, err := os.ReadFile(filepath.Join(dir, "data.bin"))
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("the file after umount and mount: %v, equal %v", err, bytes.Equal(got, data))
			}
			if _, err := Unmount(ctx, reg, dir); err != nil {
				t.Fatalf("umount: %v", err)
			}
			requireNothingLeft(t, reg, rec)

			// --mkfs over it without --force.
			mk.Force = false
			_, err = Mount(ctx, mk)
			var has *HasFileSystemError
			if !errors.As(err, &has) || has.FSType != fstype {
				t.Fatalf("mount --mkfs over %s: %v, want HasFileSystemError", fstype, err)
			}
			requireNothingLeft(t, reg, &Record{Dir: dir, FUSEDir: reg.FUSEDir(dir)})
		})
	}
}

// fakeClaimer records the claim calls and what the record held at each; refuse makes it
// refuse that action.
type fakeClaimer struct {
	calls  []string
	refuse ClaimAction
}

func (c *fakeClaimer) Claim(_ context.Context, action ClaimAction, rec *Record) error {
	c.calls = append(c.calls, fmt.Sprintf("%s helper=%v file=%v loop=%v fs=%q id=%v", action, rec.Helper.PID != 0, rec.File != "", rec.Loop != "", rec.FSType, rec.Claim.ID != ""))
	if action == c.refuse {
		return fmt.Errorf("vol0 is mounted already, on host web1 at /srv/data")
	}
	return nil
}

// TestMountTakesTheClaimBeforeItConnectsAndConfirmsItBeforeTheFileSystem: the claim is taken
// BEFORE the helper starts (the record saved with its ID first), confirmed once the helper
// is connected and BEFORE the loop device, the probe or a mkfs, and given back when a later
// step fails. A refused take sets nothing up, and a refused confirm is undone before any
// file system is touched, --mkfs --force or not.
func TestMountTakesTheClaimBeforeItConnectsAndConfirmsItBeforeTheFileSystem(t *testing.T) {
	needRoot(t, "losetup", "blkid", "mount", "mkfs.ext4")
	t.Setenv(helperEnv, "1")
	uri, tlsDir, _ := tlsExport(t, 64<<20)
	// Under a shared tree: a namespace another test makes meanwhile (ip netns exec) holds
	// no copy of these mounts once they are unmounted here.
	tree := mounttree.Shared(t)
	reg := Registry{Dir: filepath.Join(tree, "run")}
	cleanUpAfter(t, reg)
	dir := filepath.Join(tree, "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req := Request{Dir: dir, Volume: "vol0", URI: uri, TLSDir: tlsDir, Via: ViaFUSE, Connections: 2,
		IOTimeout: time.Minute, Helper: []string{os.Args[0]}, Registry: reg, Claim: &Claim{Addr: "unix:///x", Host: "web2"}}

	refused := &fakeClaimer{refuse: ClaimTake}
	req.Claimer, req.MakeFS, req.Force = refused, true, true
	if _, err := Mount(ctx, req); err == nil || !strings.Contains(err.Error(), "mounted already") {
		t.Fatalf("a mount whose claim is refused: %v", err)
	}
	if want := []string{"take helper=false file=false loop=false fs=\"\" id=true"}; !reflect.DeepEqual(refused.calls, want) {
		t.Fatalf("claim calls %q, want %q", refused.calls, want)
	}
	requireNothingLeft(t, reg, &Record{Dir: dir, FUSEDir: reg.FUSEDir(dir)})

	lost := &fakeClaimer{refuse: ClaimConfirm}
	req.Claimer = lost
	if _, err := Mount(ctx, req); err == nil {
		t.Fatal("a mount whose claim was lost while it connected went on")
	}
	if want := []string{"take helper=false file=false loop=false fs=\"\" id=true", "confirm helper=true file=true loop=false fs=\"\" id=true", "release helper=true file=true loop=false fs=\"\" id=true"}; !reflect.DeepEqual(lost.calls, want) {
		t.Fatalf("claim calls %q, want %q", lost.calls, want)
	}
	requireNothingLeft(t, reg, &Record{Dir: dir, FUSEDir: reg.FUSEDir(dir)})

	granted := &fakeClaimer{}
	req.Claimer = granted
	rec, err := Mount(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"take helper=false file=false loop=false fs=\"\" id=true", "confirm helper=true file=true loop=false fs=\"\" id=true"}; !reflect.DeepEqual(granted.calls, want) {
		t.Fatalf("claim calls %q, want %q", granted.calls, want)
	}
	if rec.Claim == nil || rec.Claim.Host != "web2" || len(rec.Claim.ID) != 16 {
		t.Fatalf("the record's claim: %+v", rec.Claim)
	}
	if _, err := Unmount(ctx, reg, dir); err != nil {
		t.Fatal(err)
	}
}
