package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/multipath"
	"github.com/replvol/replvol/node"
	"github.com/replvol/replvol/transport"
)

// Options are the demo's flags, checked by replctl demo.
type Options struct {
	// Dir holds the disks, state and logs; "" is a fresh temp dir,
	// removed at the end.
	Dir string
	// BasePort is alpha's control port; the other five ports follow it
	// (0: free ports).
	BasePort int
	// Size is the volume's size in bytes.
	Size int64
	// Paths gives each node this many multipath paths (0: a plain disk).
	Paths int
	// Metadata is internal or external.
	Metadata string
	// TLS makes every link mutual TLS with a fresh CA in Dir/tls, and
	// NBDTLS is then the export's policy (config.NBDTLS*).
	TLS    bool
	NBDTLS string
	// NoChecksums lays out the metadata without the checksum area (the
	// volume's checksums: off).
	NoChecksums bool
}

// Run starts nodes alpha and beta in this process, prints on out the
// lines replctl demo shows (its NBD URI, then "ready"), and stops both
// nodes cleanly when ctx ends.
func Run(ctx context.Context, out io.Writer, o Options) (err error) {
	dir, basePort, size, paths, mdPlace, withTLS, nbdTLS := o.Dir, o.BasePort, o.Size, o.Paths, o.Metadata, o.TLS, o.NBDTLS
	if dir == "" {
		dir, err = os.MkdirTemp("", "replvol-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	names := []string{"alpha", "beta"}
	var listeners []net.Listener
	defer func() {
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
		}
	}()
	for i := range 6 {
		addr := "127.0.0.1:0"
		if basePort != 0 {
			addr = fmt.Sprintf("127.0.0.1:%d", basePort+i)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w (choose another --base-port, or 0 for free ports)", addr, err)
		}
		listeners = append(listeners, l)
	}
	cfg := &node.Config{}
	vol := node.VolumeConfig{Name: "vol0", Size: node.VolumeSize(size), Protocol: "C", Primary: "alpha", Disks: map[string]node.DiskConfig{}}
	for i, name := range names {
		nodeDir := filepath.Join(dir, name)
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			return err
		}
		img := filepath.Join(nodeDir, "vol0.img")
		// The backing file holds the volume and, with internal metadata,
		// the metadata at its end.
		devSize := size
		if mdPlace == "internal" {
			if devSize, err = metadata.InternalDeviceSizeFor(size, 0, 1, !o.NoChecksums); err != nil {
				return err
			}
		}
		if paths == 0 {
			if err := ensureSparseFile(img, devSize); err != nil {
				return err
			}
			vol.Disks[name] = node.SinglePath(img)
		} else {
			// Every path reaches the same file, which also holds the
			// multipath label in its last 4 KiB.
			if err := ensureSparseFile(img, devSize+multipath.LabelSize); err != nil {
				return err
			}
			devs := make([]string, paths)
			for i := range devs {
				devs[i] = img
			}
			dc := node.MultiPath(devs...)
			// Quick reactions for a demo: probe failed paths every second,
			// and with no path left queue IO 3 s before detaching the disk.
			dc.CheckInterval = node.Duration(time.Second)
			dc.NoPathRetry = 3
			vol.Disks[name] = dc
		}
		if mdPlace == "external" {
			meta := filepath.Join(nodeDir, "vol0.md")
			mdSize, err := metadata.ExternalSizeFor(size, 0, 1, !o.NoChecksums)
			if err != nil {
				return err
			}
			if err := ensureSparseFile(meta, mdSize); err != nil {
				return err
			}
			dc := vol.Disks[name]
			dc.Meta = meta
			vol.Disks[name] = dc
		}
		cfg.Nodes = append(cfg.Nodes, node.NodeConfig{
			Name:        name,
			Control:     listeners[3*i].Addr().String(),
			Replication: listeners[3*i+1].Addr().String(),
			NBD:         listeners[3*i+2].Addr().String(),
			StateDir:    nodeDir,
		})
	}
	vol.Metadata = mdPlace
	if o.NoChecksums {
		vol.Checksums = "off"
	}
	cfg.Volumes = []node.VolumeConfig{vol}
	tlsDir := filepath.Join(dir, "tls")
	if withTLS {
		var holders []pki.Holder
		for _, nc := range cfg.Nodes {
			holders = append(holders, pki.Holder{Identity: pki.Identity{Role: pki.RoleNode, Name: nc.Name}, Hosts: []string{"127.0.0.1", "localhost"}})
		}
		if _, err := pki.Init(tlsDir, holders, true); err != nil {
			return err
		}
		cfg.TLS = &node.TLSConfig{CA: filepath.Join(tlsDir, pki.CAFile), Cert: filepath.Join(tlsDir, "{node}.crt"), Key: filepath.Join(tlsDir, "{node}.key"), NBD: nbdTLS}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if data, err := cfg.Marshal(); err == nil {
		os.WriteFile(filepath.Join(dir, "cluster.yaml"), data, 0o644)
	}
	logFile, err := os.OpenFile(filepath.Join(dir, "demo.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	log := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo}))

	var nodes []*node.Node
	defer func() {
		// The primary stops first, so it hands its last writes over cleanly.
		for _, n := range nodes {
			n.Close()
		}
	}()
	for i, name := range names {
		n, err := node.New(cfg, name, node.Options{
			Logger: log, Control: listeners[3*i], Replication: listeners[3*i+1], NBD: listeners[3*i+2],
		})
		if err != nil {
			return err
		}
		if err := n.Start(); err != nil {
			n.Close()
			return err
		}
		nodes = append(nodes, n)
	}
	fmt.Fprintf(out, "replvol demo in %s (log: %s)\n", dir, filepath.Join(dir, "demo.log"))
	for _, nc := range cfg.Nodes {
		fmt.Fprintf(out, "node %s: control %s replication %s nbd %s\n", nc.Name, nc.Control, nc.Replication, nc.NBD)
	}
	fmt.Fprintf(out, "volume vol0: %s, protocol C, primary alpha; waiting for beta to be in sync...\n", human.Bytes(size))
	// The node's own unix socket needs no certificate.
	if err := waitInSync(ctx, "unix://"+filepath.Join(cfg.Nodes[0].StateDir, "control.sock"), 10*time.Minute); err != nil {
		return err
	}
	switch {
	case withTLS && nbdTLS == config.NBDTLSOff:
		fmt.Fprintf(out, "try: REPLCTL_ADDR=%s REPLCTL_TLS_DIR=%s replctl status\n", cfg.Nodes[0].Control, tlsDir)
		fmt.Fprintf(out, "nbd://%s/vol0\n", cfg.Nodes[0].NBD)
	case withTLS:
		fmt.Fprintf(out, "try: REPLCTL_ADDR=%s REPLCTL_TLS_DIR=%s replctl status\n", cfg.Nodes[0].Control, tlsDir)
		fmt.Fprintf(out, "nbds://%s/vol0?tls-certificates=%s\n", cfg.Nodes[0].NBD, filepath.Join(tlsDir, pki.NBDClientDir))
	default:
		fmt.Fprintf(out, "try: REPLCTL_ADDR=%s replctl status\n", cfg.Nodes[0].Control)
		fmt.Fprintf(out, "nbd://%s/vol0\n", cfg.Nodes[0].NBD)
	}
	fmt.Fprintln(out, "ready")
	<-ctx.Done()
	fmt.Fprintln(out, "stopping")
	return nil
}

func ensureSparseFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	switch {
	case st.Size() == 0:
		return f.Truncate(size)
	case st.Size() != size:
		return fmt.Errorf("%s exists with %d bytes, not %d: use another --dir or the old --size", path, st.Size(), size)
	}
	return nil
}

// waitInSync polls the cluster until every replica is UpToDate.
func waitInSync(ctx context.Context, addr string, timeout time.Duration) error {
	c, err := transport.DialControl(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := c.ClusterStatus(ctx, &transport.StatusRequest{})
		if err == nil && allInSync(st) {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the replicas did not get in sync in time; see the log")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func allInSync(st *transport.ClusterStatus) bool {
	for _, v := range st.Volumes {
		for _, r := range v.Replicas {
			if r.Disk != transport.DiskUpToDate || r.Replication != transport.ReplConnected || r.OutOfSyncBytes != 0 {
				return false
			}
		}
	}
	return len(st.Volumes) > 0
}
