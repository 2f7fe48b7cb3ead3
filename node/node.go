package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/replvol/replvol/internal/buildinfo"
	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/connlimit"
	"github.com/replvol/replvol/internal/logonce"
	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/multipath"
	"github.com/replvol/replvol/node/cluster"
	"github.com/replvol/replvol/node/control"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/web"
	"google.golang.org/grpc"
)

// Options are the parts of a node that do not come from the config file.
type Options struct {
	// StateDir overrides the node's state directory.
	StateDir string
	// Logger receives the node's log; nil discards it.
	Logger *slog.Logger
	// Listeners, when set, are used instead of listening on the configured
	// addresses (the demo opens them first to learn free ports).
	Control, Replication, NBD net.Listener
	// OpenDisk opens a volume's single-path backing disk; nil means
	// OpenDisk. Tests put fault-injecting disks here.
	OpenDisk func(path string, size int64) (Disk, error)
	// OpenPath opens one path of a multipath disk; nil means
	// multipath.OpenFilePath. Tests put fault-injecting paths here.
	OpenPath func(PathConfig) (multipath.Path, error)
	// Raft, when set, accepts raft's connections instead of a listener on
	// the configured raft address.
	Raft net.Listener
	// ClusterTiming overrides raft, gossip and lease timings (zero fields
	// keep their defaults).
	ClusterTiming cluster.Timing
	// Join: this node was added to a running cluster (replctl node add);
	// it does not bootstrap raft but waits for the leader to add it.
	Join bool
	// Version is the release of the program that runs the node, which
	// its status shows (replnode's, with -ldflags); empty: the release
	// the binary's build info gives (internal/buildinfo).
	Version string
	// WrapStream, when set, wraps each replication stream this node opens
	// to a peer: tests put a slow or failing link there.
	WrapStream func(peer string, s *transport.ReplStream) *transport.ReplStream
	// wrapStore, when set, wraps the node's state store (tests inject
	// write failures there).
	wrapStore func(stateStore) stateStore
	// bootID, when set, stands for the operating system's boot id (tests
	// simulate a reboot with it).
	bootID string
	// wrapControl, when set, wraps the control API this node serves on
	// its port (tests stand a node of an earlier release there).
	wrapControl func(transport.ControlServer) transport.ControlServer
	// controlConns and controlConnsPerHost, when set, replace the
	// control port's connection limits (tests).
	controlConns, controlConnsPerHost int
	// reattach, when set, replaces the probes' timing of a detached disk
	// (its zero fields keep their defaults) and their clock (tests).
	reattach reattachPolicy
	// clock, when set, is the node's time (tests set a clock.Fake); nil
	// is clock.Real(). The cluster (its leases: Cluster.Clock), the
	// control port, the sessions and the applier keep it too.
	clock clock.Clock
}

// bootID identifies the running boot of the operating system ("" when it
// cannot be read: every start then counts as after a reboot).
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// stateStore is the node's own durable state (statefile.Store: bbolt):
// volume states and the event history. Tests wrap it to inject failures.
type stateStore interface {
	Volume(name string) (statefile.VolumeState, bool, error)
	// PutVolume is durable BEFORE it returns.
	PutVolume(name string, st statefile.VolumeState) error
	// Scrub and PutScrub keep a volume's scrub checkpoint; PutScrub is
	// durable BEFORE it returns.
	Scrub(name string) (statefile.ScrubState, bool, error)
	PutScrub(name string, st statefile.ScrubState) error
	// DeleteVolume is durable BEFORE it returns.
	DeleteVolume(name string) error
	AddEvent(e statefile.Event) (statefile.Event, error)
	Events(n int) ([]statefile.Event, error)
	Close() error
}

// Node is one running replvol node.
type Node struct {
	// cfg is the config the node runs with, and vols the volumes it
	// holds. Both are replaced whole when volumes are added or removed
	// at runtime (volumes.go) and never changed once published: read
	// them through config() and volumes(), once per use.
	cfg  atomic.Pointer[Config]
	vols atomic.Pointer[map[string]*Volume]
	// volsChanged is notified when vols changes, and when a pass over
	// raft's created volumes ends (awaitVolume).
	volsChanged changes

	name string
	self NodeConfig
	log  *slog.Logger
	// clock is the node's time (Options.clock): every reading of the time
	// and every timer of the node and its volumes is made on it.
	clock clock.Clock
	// opts are the options the node was made with (a volume added at
	// runtime opens its disk as New did).
	opts Options

	store stateStore
	// tls is this node's certificate and the cluster's CA (nil: the
	// config has no tls: section, every link is plaintext); gossipKey is
	// memberlist's key.
	tls       *pki.Bundle
	gossipKey []byte
	// refusals logs each refused peer or caller once per cause.
	refusals *control.RefusalLog
	// gate authorizes the control API's calls (node/control).
	gate *control.Gate
	// api is this node's control API (node/control), on the node's
	// adapter (controlapi.go).
	api *control.Server
	// bootID is the operating system's boot this node runs in.
	bootID string
	// stateDir holds the node's state and its unix socket.
	stateDir string
	// controlConns and controlConnsPerHost limit the control port's
	// connections.
	controlConns, controlConnsPerHost int
	// known is the addresses of the cluster's nodes: every port keeps
	// a share of its connections for them (admission.go).
	known *connlimit.Known

	nbd      *nbd.Server
	repl     *transport.ReplServer
	ctlGRPC  *grpc.Server
	http     *http.Server
	registry *prometheus.Registry
	// httpUnix serves the same API and pages on the unix socket
	// (lnUnix, at unixPath) to whoever may open it, with no certificate.
	httpUnix *http.Server
	lnUnix   net.Listener
	unixPath string

	lnControl, lnRepl, lnNBD net.Listener

	// events fans the node's events out to live subscribers.
	events eventHub
	// life ends when the node closes (endLife).
	life    context.Context
	endLife context.CancelFunc

	// cl is the cluster (raft and gossip); nil without their addresses.
	cl       *clusterState
	stopLoop chan struct{}
	// wrapStream is Options.WrapStream.
	wrapStream func(peer string, s *transport.ReplStream) *transport.ReplStream
	// dataRefusals are the refusals of the data-plane links (replication,
	// raft) logged lately: each once per peer and cause.
	dataRefusals *logonce.Set

	// volMu serialises the changes of the volumes (ApplyVolumes) with
	// each other and with Close.
	volMu mutex

	mu mutex
	// view is what the last ApplyVolumes left unlike the file.
	view configView
	// failedReload is the last reload's failure (reload.go), nil when it
	// loaded.
	failedReload *transport.FailedReload
	clients      map[string]*transport.ControlClient
	// statusFailed: the nodes whose last status ask failed (askStatus).
	statusFailed map[string]bool
	wg           sync.WaitGroup
	closed       bool
	// beats are the heartbeats shared by the streams to each peer node,
	// by its name (session.PairBeat).
	beats sync.Map
	// claims are the mount claims of the volumes this node is primary of
	// (claims.go).
	claims mountClaims
	// createdProblems: per volume created at run time, why this node
	// does not run it as raft records it (created.go), as last said.
	createdProblems map[string]string
	// createdKick wakes createdLoop (one buffered slot).
	createdKick chan struct{}
}

// New opens the node's state and disks. Nothing listens until Start.
func New(cfg *Config, name string, opts Options) (*Node, error) {
	self, ok := cfg.Node(name)
	if !ok {
		var names []string
		for _, n := range cfg.Nodes {
			names = append(names, n.Name)
		}
		return nil, fmt.Errorf("node %q is not in the config (nodes: %s)", name, strings.Join(names, ", "))
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	n := &Node{
		name: name, self: self, log: log.With("node", name), opts: opts, clock: clock.Or(opts.clock),
		clients: map[string]*transport.ControlClient{}, statusFailed: map[string]bool{},
		lnControl: opts.Control, lnRepl: opts.Replication, lnNBD: opts.NBD,
		stopLoop: make(chan struct{}), wrapStream: opts.WrapStream, bootID: opts.bootID,
		claims:       mountClaims{wake: make(chan struct{}, 1), base: clock.Or(opts.clock)},
		controlConns: control.MaxConns, controlConnsPerHost: control.MaxConnsPerHost,
		createdProblems: map[string]string{}, createdKick: make(chan struct{}, 1),
	}
	n.cfg.Store(cfg)
	n.vols.Store(&map[string]*Volume{})
	if opts.controlConns > 0 {
		n.controlConns = opts.controlConns
	}
	if opts.controlConnsPerHost > 0 {
		n.controlConnsPerHost = opts.controlConnsPerHost
	}
	if n.bootID == "" {
		n.bootID = bootID()
	}
	if n.opts.Version == "" {
		n.opts.Version = buildinfo.Read("").Release
	}
	n.known = knownAddresses(cfg, n.log)
	n.dataRefusals = logonce.New(refusalQuiet, maxRefusalsKept, nil)
	n.refusals = control.NewRefusalLog(n.log, refusalQuiet, maxRefusalsKept)
	if err := n.loadTLS(); err != nil {
		return nil, err
	}
	n.gate = control.NewGate(n.name, n.tls, n.log, n.refusals)
	n.api = control.NewServer(controlNode{n}, n.gate, n.clock)
	n.life, n.endLife = context.WithCancel(context.Background())
	dir := opts.StateDir
	if dir == "" {
		dir = self.StateDir
	}
	if dir == "" {
		return nil, fmt.Errorf("node %s: no state directory: set nodes[].state_dir in the config or pass --state-dir", name)
	}
	n.stateDir = dir
	st, err := statefile.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		return nil, err
	}
	n.store = st
	if opts.wrapStore != nil {
		n.store = opts.wrapStore(st)
	}
	// size: max is this node's recorded size of the volume, or what its
	// disk holds when the volume is new here.
	file := cfg
	if cfg, err = n.resolveSizes(cfg); err != nil {
		st.Close()
		return nil, err
	}
	preferred := balanceByGroup(cfg, name)
	// Authority mode, as openCluster sets it up (n.cl.auto).
	auth, _ := cfg.FailoverMode()
	vols := map[string]*Volume{}
	for i := range cfg.Volumes {
		vc := cfg.Volumes[i]
		if _, ok := vc.Disks[name]; !ok {
			continue
		}
		v, err := n.openVolume(vc, file.Volumes[i].Size == SizeMax, preferred[vc.Name], auth)
		if err != nil {
			closeVolumes(vols)
			st.Close()
			return nil, err
		}
		if vc.Size == SizeMax {
			cfg.Volumes[i].Size = v.cfg.Size // cfg is resolveSizes' copy
		}
		vols[vc.Name] = v
	}
	n.cfg.Store(cfg)
	n.vols.Store(&vols)
	n.volsChanged.notify()
	n.makePoolDirs(cfg)
	if err := n.openCluster(dir, opts); err != nil {
		closeVolumes(vols)
		st.Close()
		return nil, err
	}
	return n, nil
}

// openVolume opens this node's disk and metadata of volume vc (creating
// the metadata of a volume new here) and its state. sizeMax: the file
// says size: max; vc.Size is then this node's recorded size, or SizeMax
// for a volume it never ran, resolved here from what the disk holds.
// auth: the cluster decides the volume's primary (authority mode).
func (n *Node) openVolume(vc VolumeConfig, sizeMax bool, preferred int, auth bool) (*Volume, error) {
	dc := vc.Disks[n.name]
	disk, mp, err := n.openDisk(vc, dc, preferred, n.opts)
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", vc.Name, err)
	}
	if vc.Size == SizeMax {
		size, err := n.usableSize(vc, disk)
		if err != nil {
			disk.Close()
			return nil, fmt.Errorf("volume %s: %w", vc.Name, err)
		}
		vc.Size = VolumeSize(size)
		n.event(vc.Name, "size-max", fmt.Sprintf("size: max: the volume is %d bytes (%s), the largest %s holds after its metadata; recorded, it stays so", size, sizeText(size), dc.Paths[0].Path))
	}
	md, closeMD, err := n.openMD(vc, disk)
	if err != nil {
		disk.Close()
		return nil, fmt.Errorf("volume %s: %w", vc.Name, err)
	}
	v, err := newVolume(n, vc, disk, md, auth)
	if err != nil {
		closeMD()
		disk.Close()
		return nil, err
	}
	v.durable.closeMD = closeMD
	v.mp = mp
	v.durable.sizeMax = sizeMax
	return v, nil
}

// closeVolumes closes volumes that were opened and never started.
func closeVolumes(vols map[string]*Volume) {
	for _, v := range vols {
		v.loop.Close()
		v.durable.md.Close()
		v.durable.closeMD()
		v.disk.Close()
	}
}

// config is the config the node runs with now; it must not be changed.
func (n *Node) config() *Config { return n.cfg.Load() }

// volumes are the volumes this node holds now, by name; the map must not
// be changed (setVolumes publishes a new one).
func (n *Node) volumes() map[string]*Volume { return *n.vols.Load() }

// Name is the node's name.
func (n *Node) Name() string { return n.name }

// Start listens on the node's addresses and starts its volumes.
func (n *Node) Start() error {
	var err error
	listen := func(ln *net.Listener, addr, what string) {
		if err != nil || *ln != nil {
			return
		}
		*ln, err = net.Listen("tcp", addr)
		if err != nil {
			err = fmt.Errorf("node %s: listen for %s on %s: %w", n.name, what, addr, err)
		}
	}
	listen(&n.lnControl, n.self.Control, "control")
	if !n.self.IsWitness() {
		listen(&n.lnRepl, n.self.Replication, "replication")
		listen(&n.lnNBD, n.self.NBD, "nbd")
	}
	if err == nil {
		n.unixPath = filepath.Join(n.stateDir, controlSocket)
		var ln net.Listener
		if ln, err = transport.ListenUnix(n.unixPath); err != nil {
			err = fmt.Errorf("node %s: listen on the unix socket %s: %w", n.name, n.unixPath, err)
		} else {
			n.lnUnix = control.NewListener(ln, "unix socket", nil, control.Limits{Max: n.controlConns, PerHost: n.controlConns, Clock: n.clock}, n.log, n.refusals)
		}
	}
	if err != nil {
		n.closeListeners()
		return err
	}
	var controlTLS *tls.Config
	if n.tls != nil {
		controlTLS = n.tls.AskingServerConfig()
		controlTLS.NextProtos = []string{"h2", "http/1.1"}
	}
	n.lnControl = control.NewListener(n.lnControl, "control", controlTLS,
		control.Limits{Max: n.controlConns, PerHost: n.controlConnsPerHost, Known: n.known, Clock: n.clock}, n.log, n.refusals)

	n.registry = prometheus.NewRegistry()
	n.registry.MustRegister(newCollector(n))
	n.nbd = nbd.NewServer(n.nbdConfig())
	n.repl = transport.NewReplServer(n.handleStream, append(n.replServerOptions(), transport.ReplKnown(n.known), transport.ReplLogger(n.log))...)
	var served transport.ControlServer = n.api
	if n.opts.wrapControl != nil {
		served = n.opts.wrapControl(served)
	}
	n.ctlGRPC = transport.NewControlGRPC(served, transport.WithAuthorize(n.gate.Authorize))
	mux := web.NewMux(web.Source{
		Status:   func(ctx context.Context) (*transport.ClusterStatus, error) { return n.clusterStatus(ctx, 20) },
		Node:     func(context.Context) (*transport.NodeStatus, error) { return n.nodeStatus(50), nil },
		Registry: n.registry,
		Events: func(ctx context.Context, history int, fn func(*transport.Event) error) error {
			return n.api.Events(ctx, &transport.EventsRequest{History: history}, fn)
		},
		History: func(_ context.Context, max int) ([]transport.Event, error) { return controlNode{n}.History(max) },
		Peer: func(ctx context.Context, ni transport.NodeInfo) (*transport.NodeStatus, error) {
			api, err := n.peerAPI(ni.Name)
			if err != nil {
				return nil, err
			}
			return api.NodeStatus(ctx, &transport.StatusRequest{Events: 50})
		},
		Context: n.life,
	})
	handler := n.gate.GuardHTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			n.ctlGRPC.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	// With TLS, HTTPS: HTTP/2 (gRPC and the page) or HTTP/1.1 by ALPN;
	// without, h2c and HTTP/1.1 in plaintext, as the unix socket always.
	var protocols, plain http.Protocols
	protocols.SetHTTP1(true)
	plain.SetHTTP1(true)
	plain.SetUnencryptedHTTP2(true)
	if n.tls != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols = plain
	}
	n.http = &http.Server{
		Protocols:         &protocols,
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: maxControlStreams},
		ErrorLog:          slog.NewLogLogger(n.log.With("part", "control").Handler(), slog.LevelDebug),
	}
	n.httpUnix = &http.Server{
		Protocols: &plain,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			handler.ServeHTTP(w, r.WithContext(control.Local(r.Context())))
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: maxControlStreams},
		ErrorLog:          slog.NewLogLogger(n.log.With("part", "control").Handler(), slog.LevelDebug),
	}

	for _, v := range n.volumes() {
		v.start()
	}
	if !n.self.IsWitness() {
		n.serve(func() error { return n.nbd.Serve(n.lnNBD) })
		n.serve(func() error { return n.repl.Serve(n.lnRepl) })
		n.serve(func() error { n.watchClaims(n.stopLoop); return nil })
	}
	if n.cl != nil {
		n.serve(func() error { n.clusterLoop(n.stopLoop); return nil })
		n.serve(func() error { n.clusterEvents(n.stopLoop); return nil })
		n.serve(func() error { n.createdLoop(n.stopLoop); return nil })
	}
	n.serve(func() error {
		if err := n.http.Serve(n.lnControl); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	n.serve(func() error {
		if err := n.httpUnix.Serve(n.lnUnix); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	if n.self.IsWitness() {
		n.log.Info("witness started", "control", n.ControlAddr(), "raft", n.self.Raft, "gossip", n.self.Gossip)
	} else {
		n.log.Info("node started", "control", n.ControlAddr(), "replication", n.lnRepl.Addr(), "nbd", n.lnNBD.Addr())
	}
	n.event("", "started", fmt.Sprintf("node %s started", n.name))
	return nil
}

func (n *Node) serve(f func() error) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := f(); err != nil {
			n.log.Error("server stopped", "err", err)
		}
	}()
}

func (n *Node) closeListeners() {
	for _, l := range []net.Listener{n.lnControl, n.lnRepl, n.lnNBD, n.lnUnix} {
		if l != nil {
			l.Close()
		}
	}
	if n.lnUnix != nil {
		if err := os.Remove(n.unixPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			n.log.Warn("remove the unix socket", "path", n.unixPath, "err", err)
		}
	}
}

// controlSocket is the unix socket in the state directory.
const controlSocket = "control.sock"

// maxControlStreams bounds the calls and streams in flight on one
// control connection.
const maxControlStreams = 100

// ControlAddr is the address the control API listens on.
func (n *Node) ControlAddr() string { return n.lnControl.Addr().String() }

// ControlSocket is the control API's unix socket address
// (unix:///STATE_DIR/control.sock): no certificate is needed there.
func (n *Node) ControlSocket() string { return transport.UnixScheme + n.unixPath }

// NBDAddr is the address the NBD server listens on.
func (n *Node) NBDAddr() string { return n.lnNBD.Addr().String() }

// Close stops the node cleanly: NBD requests in flight are answered, the
// volumes are flushed, and their state is marked clean.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	close(n.stopLoop)
	n.endLife()
	if n.nbd != nil {
		n.nbd.Shutdown(ctx)
	}
	if n.repl != nil {
		// No stream from a primary is served once the volumes close their
		// disks: one still handled could step a volume down and write its
		// superblock to a closed disk. The peers see the connection go
		// and then find nobody listening.
		n.repl.Stop()
	}
	n.volMu.Lock() // a volume being added or removed is done first
	for _, v := range n.volumes() {
		v.shutdown()
	}
	n.volMu.Unlock()
	if n.cl != nil {
		if err := n.cl.c.Close(); err != nil {
			n.log.Warn("close the cluster", "err", err)
		}
	}
	if n.http != nil {
		n.ctlGRPC.Stop()
		n.http.Shutdown(ctx)
		n.httpUnix.Shutdown(ctx)
	}
	n.closeListeners()
	n.wg.Wait()
	n.mu.Lock()
	for _, c := range n.clients {
		c.Close()
	}
	n.mu.Unlock()
	n.event("", "stopped", fmt.Sprintf("node %s stopped cleanly", n.name))
	return n.store.Close()
}

// event records one line of history; failures only reach the log.
func (n *Node) event(volume, kind, msg string) {
	n.emit(statefile.Event{Volume: volume, Kind: kind, Message: msg})
}

// peerEvent records an event about one peer of a volume.
func (n *Node) peerEvent(volume, kind, peer, msg string) {
	n.emit(statefile.Event{Volume: volume, Kind: kind, Peer: peer, Message: msg})
}

// client returns a control client for another node.
func (n *Node) client(name string) (*transport.ControlClient, error) {
	nc, ok := n.config().Node(name)
	if !ok {
		return nil, fmt.Errorf("no node %q in the config", name)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.clients[name]; ok {
		return c, nil
	}
	opts := []transport.DialOption{transport.WithOutgoing(n.gate.Outgoing)}
	if n.tls != nil {
		// The node dialed must be the one the config names there.
		opts = append(opts, transport.WithTLS(n.tls.ClientConfig(nc.Control, pki.Exactly(pki.Identity{Role: pki.RoleNode, Name: name}))),
			transport.WithHandshakeFailure(func(err error) {
				why := transport.TLSWords(err)
				n.refusals.Note(name, why, "refused the control port of a node", "peer", name, "addr", nc.Control, "why", why)
			}))
	}
	c, err := transport.DialControl(nc.Control, opts...)
	if err != nil {
		return nil, err
	}
	c.WaitForReady()
	n.clients[name] = c
	return c, nil
}

// openingWait bounds how long a control call waits for a volume raft
// records as created on this node to open here (awaitVolume).
const openingWait = 10 * time.Second

// awaitVolume is volume, but for a volume raft records as created with
// this node among its replicas, which this node has not opened yet: its
// open is under way (createdLoop), and a call that comes right after the
// create (a resize of a volume just made, csi-sanity's ExpandVolume) waits
// for it, until ctx ends or openingWait passes, or raft's record no
// longer names this node.
func (n *Node) awaitVolume(ctx context.Context, name string) (*Volume, error) {
	v, err := n.volume(name)
	if err == nil || n.cl == nil {
		return v, err
	}
	waitUntil(ctx, n.clock, openingWait, &n.volsChanged, func() bool {
		if v, err = n.volume(name); err == nil {
			return true
		}
		def, ok := n.cl.c.Authority().Creates[name]
		return !ok || !slices.Contains(def.Nodes, n.name)
	})
	return v, err
}

// volume returns the named volume held by this node.
func (n *Node) volume(name string) (*Volume, error) {
	vols := n.volumes()
	v, ok := vols[name]
	if !ok {
		var names []string
		for k := range vols {
			names = append(names, k)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("%w: node %s holds no volume %q (it holds: %s)", errNotFound, n.name, name, strings.Join(names, ", "))
	}
	return v, nil
}

// errNotFound is control.ErrNotFound: the control API answers it
// NotFound.
var errNotFound = control.ErrNotFound

// nbdURI is the export URI of a volume on a node.
func (n *Node) nbdURI(node, volume string) string {
	nc, ok := n.config().Node(node)
	if !ok {
		return ""
	}
	addr := nc.NBD
	if node == n.name && n.lnNBD != nil {
		addr = n.lnNBD.Addr().String()
	}
	return fmt.Sprintf("%s://%s/%s", n.nbdScheme(), addr, volume)
}

// nbdScheme is the scheme of the volumes' NBD URIs: nbds (libnbd's NBD over TLS) when every
// client must use TLS, as the cluster file says for every node.
func (n *Node) nbdScheme() string {
	if n.config().TLS.NBDPolicy() == NBDTLSRequired {
		return "nbds"
	}
	return "nbd"
}

// nbdCertificatesHint is the tls-certificates directory a client refused for want of TLS is
// told to use.
const nbdCertificatesHint = "DIR/" + pki.NBDClientDir + " (DIR: where replctl certs init wrote the cluster's files)"

// nbdConfig is the NBD server's configuration. With a tls: section, a client that STARTTLS
// must show a certificate of the cluster's CA for an NBD client or the operator; the section's
// nbd policy says whether it must STARTTLS.
func (n *Node) nbdConfig() nbd.Config {
	cfg := nbd.Config{Resolver: (*resolver)(n), Logger: n.log.With("part", "nbd"), Known: n.known}
	if n.tls == nil {
		return cfg
	}
	cfg.TLS = n.tls.ServerConfig(true, pki.Roles(pki.RoleNBDClient, pki.RoleOperator))
	cfg.TLSCertificatesHint = nbdCertificatesHint
	switch policy := n.config().TLS.NBDPolicy(); policy {
	case NBDTLSRequired:
		cfg.TLSPolicy = nbd.TLSRequired
	case NBDTLSOptional:
		cfg.TLSPolicy = nbd.TLSOptional
	case NBDTLSOff:
		cfg.TLSPolicy = nbd.TLSOff
	default:
		panic(fmt.Sprintf("tls.nbd %q passed Validate", policy))
	}
	return cfg
}

// resolver exposes the volumes this node is primary for over NBD.
type resolver Node

func (r *resolver) Lookup(name string) (nbd.Export, error) {
	n := (*Node)(r)
	v, err := n.volume(name)
	if err != nil {
		return nil, err
	}
	s := v.state()
	role, open, primary, why := s.role(), s.st.Serving.IsOpen(), s.st.Durable.Primary, s.why.text
	if role == replication.Primary && open {
		return v, nil
	}
	if role == replication.Primary {
		if why == "" {
			why = "switchover or shutdown in progress; try again"
		}
		return nil, fmt.Errorf("%s: node %s is Primary but not serving IO: %s", name, n.name, why)
	}
	if primary == "" || primary == n.name {
		return nil, fmt.Errorf("%s: node %s is Secondary and no primary is known; see replctl status", name, n.name)
	}
	return nil, fmt.Errorf("%s: node %s is Secondary; the primary is %s at %s", name, n.name, primary, n.nbdURI(primary, name))
}

func (r *resolver) List() []string {
	n := (*Node)(r)
	var out []string
	for name, v := range n.volumes() {
		if v.state().serving() {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// nbdClient is one NBD client of a volume on this node.
type nbdClient struct {
	addr  string
	since time.Time
	// export is the volume it uses.
	export string
}

// nbdClients lists the NBD clients connected to a volume's export here
// (every export's for "").
func (n *Node) nbdClients(volume string) []nbdClient {
	if n.nbd == nil {
		return nil
	}
	var out []nbdClient
	for _, c := range n.nbd.Clients(volume) {
		out = append(out, nbdClient{addr: c.RemoteAddr, since: c.Since, export: c.Export})
	}
	return out
}

// loadTLS reads the node's certificate, the CA and the gossip key the
// config names; a certificate that does not name this node is refused.
// Without a tls: section it says, once, that the cluster is
// unauthenticated.
func (n *Node) loadTLS() error {
	t := n.config().TLS
	if t == nil {
		n.log.Warn("the cluster is unauthenticated: every link is plaintext and anyone who reaches this node's ports can command it and read its volumes; add a tls: section (replctl certs init writes the files)")
		return nil
	}
	b, err := pki.Load(t.CA, t.CertFor(n.name), t.KeyFor(n.name))
	if err != nil {
		return fmt.Errorf("node %s: tls: %w", n.name, err)
	}
	if want := (pki.Identity{Role: pki.RoleNode, Name: n.name}); b.Self != want {
		return fmt.Errorf("node %s: tls: %s names %s, not %s: give this node its own certificate", n.name, t.CertFor(n.name), b.Self, want)
	}
	n.tls = b
	if t.GossipKey != "" {
		if n.gossipKey, err = pki.LoadGossipKey(t.GossipKey); err != nil {
			return fmt.Errorf("node %s: tls: %w", n.name, err)
		}
	}
	return nil
}
