package volmount

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/transport/nbdclient"
)

// HelperConfig is what the helper process is told: it is the NBD client of one mount, and
// for ViaFUSE the FUSE server of the export's file, until it is told to stop (SIGTERM) or its
// FUSE file system is unmounted.
type HelperConfig struct {
	Via Via
	// URI is the export's; TLSDir holds the NBD client's certificate (pki.LoadNBDClient)
	// when the URI is nbds://.
	URI    string
	TLSDir string
	// FUSEDir is where the FUSE file system is mounted (ViaFUSE), Name the file's name in it.
	FUSEDir, Name string
	// Connections is how many NBD connections to open when the server offers multi-conn.
	Connections int
	// IOTimeout bounds each NBD request (0: none); the kernel's nbd driver gets it too. With
	// Follow it bounds the time without a primary instead (nbdclient.FollowOptions).
	IOTimeout time.Duration
	// Follow: follow the volume's primary (ViaFUSE only) through the control addresses
	// Controls, taking the claim ClaimID (for ClaimHost and ClaimDir) at each new primary.
	Follow                       bool
	Volume                       string
	Controls                     []string
	ClaimID, ClaimHost, ClaimDir string
	// FollowingPath is where a ViaFUSE helper says the size its last refresh found and, when
	// it follows, which primary it serves from (Following).
	FollowingPath string
	// RefreshEvery is how often a ViaFUSE helper, following or not, asks the server whether
	// the export grew (0: DefaultRefreshEvery); a SIGHUP asks at once (replctl attach
	// --refresh).
	RefreshEvery time.Duration
}

// DefaultRefreshEvery is how often a ViaFUSE helper asks whether its export grew: NBD tells
// no client, so it asks (NBD_OPT_INFO, a handshake that carries no data).
const DefaultRefreshEvery = 30 * time.Second

// Primary is the volume's primary as a helper with --follow found it: the node's name, its
// control address and its export's URI. Confirm, when set, is called once the connection to
// the export is made, BEFORE anything is sent on it (the claim's confirm).
type Primary struct {
	Name, Control, URI string
	Confirm            func(ctx context.Context) error
}

// FindPrimary finds the volume's primary now, for a helper with --follow; it waits through
// nothing (the helper calls it again). An error that wraps nbdclient.ErrStopFollowing ends
// the following (another mount took the volume).
type FindPrimary func(ctx context.Context) (Primary, error)

// PrimaryFinder makes the FindPrimary of a helper with --follow (replctl's, over its control
// API client, which this package does not link).
type PrimaryFinder func(cfg HelperConfig, logf func(format string, args ...any)) (FindPrimary, error)

// Args are the command-line arguments that ParseHelperArgs reads back.
func (c HelperConfig) Args() []string {
	args := []string{"--via", string(c.Via), "--uri", c.URI, "--connections", fmt.Sprint(c.Connections), "--io-timeout", c.IOTimeout.String()}
	if c.TLSDir != "" {
		args = append(args, "--tls-dir", c.TLSDir)
	}
	if c.FUSEDir != "" {
		args = append(args, "--fuse-dir", c.FUSEDir, "--name", c.Name)
	}
	if c.FollowingPath != "" {
		args = append(args, "--following", c.FollowingPath)
	}
	if c.RefreshEvery > 0 {
		args = append(args, "--refresh-every", c.RefreshEvery.String())
	}
	if c.Follow {
		args = append(args, "--follow", "--volume", c.Volume, "--controls", strings.Join(c.Controls, ","))
		if c.ClaimID != "" {
			args = append(args, "--claim-id", c.ClaimID, "--claim-host", c.ClaimHost, "--claim-dir", c.ClaimDir)
		}
	}
	return args
}

// ParseHelperArgs reads the arguments Args wrote.
func ParseHelperArgs(args []string) (HelperConfig, error) {
	var c HelperConfig
	fs := flag.NewFlagSet("mount-helper", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var via string
	fs.StringVar(&via, "via", "", "")
	fs.StringVar(&c.URI, "uri", "", "")
	fs.StringVar(&c.TLSDir, "tls-dir", "", "")
	fs.StringVar(&c.FUSEDir, "fuse-dir", "", "")
	fs.StringVar(&c.Name, "name", "", "")
	fs.IntVar(&c.Connections, "connections", 1, "")
	fs.DurationVar(&c.IOTimeout, "io-timeout", 0, "")
	fs.BoolVar(&c.Follow, "follow", false, "")
	fs.StringVar(&c.Volume, "volume", "", "")
	controls := fs.String("controls", "", "")
	fs.StringVar(&c.FollowingPath, "following", "", "")
	fs.StringVar(&c.ClaimID, "claim-id", "", "")
	fs.StringVar(&c.ClaimHost, "claim-host", "", "")
	fs.StringVar(&c.ClaimDir, "claim-dir", "", "")
	fs.DurationVar(&c.RefreshEvery, "refresh-every", 0, "")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if *controls != "" {
		c.Controls = strings.Split(*controls, ",")
	}
	c.Via = Via(via)
	switch {
	case fs.NArg() != 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.Via != ViaFUSE && c.Via != ViaKernel:
		return c, fmt.Errorf("--via %q: want fuse or kernel", via)
	case c.URI == "":
		return c, errors.New("--uri missing")
	case c.Via == ViaFUSE && (c.FUSEDir == "" || c.Name == ""):
		return c, errors.New("--fuse-dir and --name missing")
	case c.Follow && c.Via != ViaFUSE:
		return c, errors.New("--follow needs --via fuse")
	case c.Follow && (c.Volume == "" || len(c.Controls) == 0 || c.FollowingPath == ""):
		return c, errors.New("--follow needs --volume, --controls and --following")
	case c.RefreshEvery < 0:
		return c, fmt.Errorf("--refresh-every %s: give a positive duration", c.RefreshEvery)
	}
	return c, nil
}

// ready is what the helper tells Mount on its file descriptor 3, as one JSON object, once it
// serves (or why it cannot).
type ready struct {
	File        string `json:"file,omitempty"`
	Device      string `json:"device,omitempty"`
	Size        int64  `json:"size,omitempty"`
	Connections int    `json:"connections,omitempty"`
	Error       string `json:"error,omitempty"`
}

// readyFD is the helper's file descriptor for its ready message.
const readyFD = 3

// RunHelper is the helper process's main: it serves until SIGTERM (or until its FUSE file
// system is unmounted), then flushes, disconnects and returns the exit status. Its log is its
// standard error. find makes the FindPrimary of --follow (nil: --follow is refused).
func RunHelper(args []string, find PrimaryFinder) int {
	logger := log.New(os.Stderr, "", log.LstdFlags)
	out := os.NewFile(readyFD, "ready")
	tell := func(r ready) {
		if out == nil {
			return
		}
		_ = json.NewEncoder(out).Encode(r)
		out.Close()
		out = nil
	}
	cfg, err := ParseHelperArgs(args)
	if err != nil {
		tell(ready{Error: err.Error()})
		logger.Print(err)
		return 2
	}
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	stop := make(chan os.Signal, 4)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	switch cfg.Via {
	case ViaFUSE:
		err = serveFUSE(cfg, find, logger, tell, stop)
	default:
		err = serveKernel(cfg, logger, tell, stop)
	}
	if err != nil {
		tell(ready{Error: err.Error()})
		logger.Print(err)
		return 1
	}
	logger.Print("stopped")
	return 0
}

// dialTimeout bounds the helper's connections to the export.
const dialTimeout = 30 * time.Second

// tlsFor is the TLS configuration for the export at uri: nil for nbd://, the NBD client's
// certificate from tlsDir for nbds://.
func tlsFor(uri nbdclient.URI, tlsDir string) (*nbdclient.Options, error) {
	opts := &nbdclient.Options{}
	if !uri.TLS {
		return opts, nil
	}
	if tlsDir == "" {
		return nil, fmt.Errorf("%s is NBD over TLS: pass --tls-dir DIR, the directory replctl certs init wrote (its %s/ holds the NBD client's certificate)", uri, pki.NBDClientDir)
	}
	b, err := pki.LoadNBDClient(tlsDir)
	if err != nil {
		return nil, fmt.Errorf("--tls-dir %s: the NBD client's certificate: %w", tlsDir, err)
	}
	opts.TLS = b.ClientConfig(uri.Addr, pki.Roles(pki.RoleNode))
	return opts, nil
}

// openExport opens cfg's export, refusing a read-only one.
func openExport(cfg HelperConfig) (*nbdclient.Pool, error) {
	uri, err := nbdclient.ParseURI(cfg.URI)
	if err != nil {
		return nil, err
	}
	uri = uri.Local()
	opts, err := tlsFor(uri, cfg.TLSDir)
	if err != nil {
		return nil, err
	}
	opts.Timeout = cfg.IOTimeout
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	pool, err := nbdclient.Open(ctx, uri.Addr, uri.Export, cfg.Connections, *opts)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", uri, err)
	}
	if pool.Export().ReadOnly() {
		pool.Close()
		return nil, fmt.Errorf("%s is read-only: the node serving it is not the volume's primary", uri)
	}
	return pool, nil
}

// serveFUSE serves the export as a file until the FUSE file system is unmounted; a stop
// signal unmounts it (when the loop device is gone: a busy file system stays, and the next
// signal tries again).
func serveFUSE(cfg HelperConfig, find PrimaryFinder, logger *log.Logger, tell func(ready), stop <-chan os.Signal) error {
	var (
		pool      fuseDevice
		conns     = 1
		refresher sizeRefresher
		state     = &followState{path: cfg.FollowingPath}
	)
	if cfg.Follow {
		f, err := followExport(cfg, find, logger, state)
		if err != nil {
			return err
		}
		pool, refresher = f, f
	} else {
		p, err := openExport(cfg)
		if err != nil {
			return err
		}
		pool, conns, refresher = p, p.Connections(), p
		state.f.Export = cfg.URI
	}
	defer pool.Close()
	srv, inode, err := mountFUSE(cfg.FUSEDir, cfg.Name, "replvol:"+pool.Export().Name, pool, logger)
	if err != nil {
		return fmt.Errorf("mount the FUSE file system on %s: %w", cfg.FUSEDir, err)
	}
	file := filepath.Join(cfg.FUSEDir, cfg.Name)
	logger.Printf("serving %s (%d bytes, %d NBD connections, following the primary: %v) as %s", cfg.URI, pool.Size(), conns, cfg.Follow, file)
	tell(ready{File: file, Size: pool.Size(), Connections: conns})
	done := make(chan struct{})
	go func() {
		srv.Wait()
		close(done)
	}()
	// Following or not, the helper asks whether the export grew (replctl resize), so that a
	// file system on the loop device can grow (resize2fs, xfs_growfs) without a remount.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	refreshed := make(chan struct{})
	defer func() { <-refreshed }()
	go func() {
		defer close(refreshed)
		state.refreshLoop(refresher, cfg.RefreshEvery, hup, done, file, inode, logger)
	}()
	for {
		select {
		case <-done:
			if err := pool.Flush(); err != nil {
				logger.Printf("the last flush: %v", err)
			}
			return nil
		case sig := <-stop:
			logger.Printf("%s: unmounting %s", sig, cfg.FUSEDir)
			if err := unmountFUSE(srv, 5*time.Second); err != nil {
				logger.Printf("cannot unmount %s yet (%v): still serving", cfg.FUSEDir, err)
			}
		}
	}
}

// fuseDevice is what serveFUSE serves: a Pool, or a Follower.
type fuseDevice interface {
	Device
	Export() nbdclient.Export
	Close() error
}

// sizeRefresher asks the server whether the export grew, and connects again when it did: a
// Pool, or a Follower.
type sizeRefresher interface {
	Size() int64
	Refresh(ctx context.Context) (int64, error)
}

// followExport connects to the volume's primary through a Follower, which finds the next
// primary when this one dies or hands over (HelperConfig.Follow).
func followExport(cfg HelperConfig, find PrimaryFinder, logger *log.Logger, state *followState) (*nbdclient.Follower, error) {
	if find == nil {
		return nil, errors.New("--follow: this helper cannot find a primary")
	}
	primary, err := find(cfg, logger.Printf)
	if err != nil {
		return nil, err
	}
	targets := map[string]Primary{}
	var mu lockorder.Mutex // a leaf (doc.go)
	locate := func(ctx context.Context) (nbdclient.Target, error) {
		p, err := primary(ctx)
		if err != nil {
			return nbdclient.Target{}, err
		}
		uri, err := nbdclient.ParseURI(p.URI)
		if err != nil {
			return nbdclient.Target{}, fmt.Errorf("%s gave the export %q: %w", p.Name, p.URI, err)
		}
		uri = uri.Local()
		opts, err := tlsFor(uri, cfg.TLSDir)
		if err != nil {
			return nbdclient.Target{}, errors.Join(nbdclient.ErrStopFollowing, err)
		}
		mu.Lock()
		targets[p.Name] = p
		mu.Unlock()
		return nbdclient.Target{Addr: uri.Addr, Export: uri.Export, Opts: *opts, Name: p.Name, Confirm: p.Confirm}, nil
	}
	connected := func(t nbdclient.Target) {
		mu.Lock()
		p := targets[t.Name]
		mu.Unlock()
		if err := state.connected(p); err != nil {
			logger.Printf("cannot say which primary is followed: %v", err)
		}
		logger.Printf("following %s: %s", p.Name, p.URI)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	f, err := nbdclient.Follow(ctx, locate, nbdclient.FollowOptions{IOTimeout: cfg.IOTimeout, Connected: connected, Logf: logger.Printf})
	if err != nil {
		return nil, fmt.Errorf("connect to the primary of %s: %w", cfg.Volume, err)
	}
	return f, nil
}

// unmountFUSE unmounts the FUSE file system, trying again for a while when it is busy (a
// loop device just detached lets go of the file a moment later).
func unmountFUSE(srv interface{ Unmount() error }, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		err := srv.Unmount()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// followState is what a ViaFUSE helper says in its Following file: the primary it follows
// (none when it does not follow), and the export's size its last refresh found.
type followState struct {
	path string
	mu   lockorder.Mutex // a leaf (doc.go)
	f    Following
}

// connected records that the helper follows p now.
func (s *followState) connected(p Primary) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.f.Primary, s.f.Control, s.f.Export, s.f.Since = p.Name, p.Control, p.URI, time.Now().UTC()
	return SaveFollowing(s.path, s.f)
}

// refreshed records a refresh's outcome.
func (s *followState) refreshed(size int64, err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.f.Size, s.f.Refreshed, s.f.RefreshError = size, time.Now().UTC(), ""
	if err != nil {
		s.f.RefreshError = err.Error()
	}
	if s.path == "" {
		return nil
	}
	return SaveFollowing(s.path, s.f)
}

// refreshLoop asks whether the export grew every `every` (DefaultRefreshEvery when 0) and on
// each SIGHUP, until done; it writes nothing when the helper was given no Following file. When it grew, the FUSE file's size is the new one (the kernel's
// cached attributes are dropped) and each loop device over the file reads its capacity again
// (LOOP_SET_CAPACITY), so that the block device grows without a detach. It never shrinks.
func (s *followState) refreshLoop(f sizeRefresher, every time.Duration, hup <-chan os.Signal, done <-chan struct{}, file string, inode fileNotifier, logger *log.Logger) {
	if every <= 0 {
		every = DefaultRefreshEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	last := f.Size()
	if err := s.refreshed(last, nil); err != nil {
		logger.Printf("cannot say the export's size: %v", err)
	}
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		case <-hup:
			logger.Printf("SIGHUP: asking whether the export grew")
		}
		ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
		size, err := f.Refresh(ctx)
		cancel()
		if err != nil {
			logger.Printf("cannot tell whether the export grew: %v", err)
		}
		if size > last {
			if errno := inode.NotifyContent(0, 0); errno != 0 {
				logger.Printf("the kernel's attributes of %s: %v", file, errno)
			}
			loops, lerr := growLoops(file)
			logger.Printf("the export grew from %d to %d bytes; loop devices over %s read their capacity again: %v", last, size, file, loops)
			if lerr != nil {
				logger.Printf("%v", lerr)
				err = errors.Join(err, lerr)
			}
			last = size
		}
		if serr := s.refreshed(size, err); serr != nil {
			logger.Printf("cannot say the export's size: %v", serr)
		}
	}
}

// fileNotifier drops what the kernel caches of the FUSE file (its size).
type fileNotifier interface {
	NotifyContent(off, sz int64) syscall.Errno
}
