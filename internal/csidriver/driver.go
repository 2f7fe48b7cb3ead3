package csidriver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// PluginName is the driver's name (GetPluginInfo), which the CSIDriver object carries too.
const PluginName = "replvol.csi.io"

// Config is what replcsi's flags give the driver.
type Config struct {
	// NodeID is this host's name for Kubernetes (NodeGetInfo).
	NodeID string
	// Addr is a replnode's control address (HOST:PORT or unix:///PATH).
	Addr string
	// TLSDir holds ca.crt, operator.crt and operator.key, as replctl certs init wrote them,
	// for a control address over TCP ("": plaintext).
	TLSDir string
	// Replctl is the replctl binary the node service attaches and detaches volumes with.
	Replctl string
	// RunDir is replctl's run directory (--run-dir): the records of what it attached.
	RunDir string
	// CallTimeout bounds each control API call (0: 30 s).
	CallTimeout time.Duration
	// AttachTimeout bounds replctl attach and detach (0: 2 minutes).
	AttachTimeout time.Duration
	// IOTimeout is replctl attach's --io-timeout: how long the attachment waits without a
	// primary before it fails requests (0: a minute).
	IOTimeout time.Duration
	// Version is the driver's version (GetPluginInfo's vendor_version; "": "dev").
	Version string
	// Logf logs a line (nil: none).
	Logf func(format string, args ...any)
}

// Driver serves CSI's Identity, Controller and Node services. Its one mutex, nodeMu,
// serialises the node service's calls that change this host's mounts (replctl runs under it);
// it is a leaf of the package: nothing else of the package is locked while it is held.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	cfg    Config
	client *transport.ControlClient
	nodeMu lockorder.Mutex
}

// New checks cfg and prepares the control API client (it connects on first use).
func New(cfg Config) (*Driver, error) {
	switch {
	case cfg.NodeID == "":
		return nil, errors.New("--node-id: give this host's node name, as Kubernetes knows it")
	case cfg.Addr == "":
		return nil, errors.New("--addr: give a replnode's control address (HOST:PORT, or unix:///var/lib/replvol/control.sock)")
	case cfg.Replctl == "":
		return nil, errors.New("--replctl: give the path of replctl, which attaches volumes on this host")
	case cfg.RunDir == "":
		return nil, errors.New("--run-dir: give the directory for the records of attached volumes")
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 30 * time.Second
	}
	if cfg.AttachTimeout == 0 {
		cfg.AttachTimeout = 2 * time.Minute
	}
	if cfg.IOTimeout == 0 {
		cfg.IOTimeout = time.Minute
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.TLSDir != "" {
		abs, err := filepath.Abs(cfg.TLSDir)
		if err != nil {
			return nil, fmt.Errorf("--tls-dir %s: %w", cfg.TLSDir, err)
		}
		cfg.TLSDir = abs
	}
	var opts []transport.DialOption
	if _, unix := transport.UnixPath(cfg.Addr); !unix && cfg.TLSDir != "" {
		b, err := pki.Load(filepath.Join(cfg.TLSDir, pki.CAFile), filepath.Join(cfg.TLSDir, pki.CertFile("operator")), filepath.Join(cfg.TLSDir, pki.KeyFile("operator")))
		if err != nil {
			return nil, fmt.Errorf("--tls-dir %s: %w: point it at the directory replctl certs init wrote, with ca.crt, operator.crt and operator.key", cfg.TLSDir, err)
		}
		opts = append(opts, transport.WithTLS(b.ClientConfig(cfg.Addr, pki.Roles(pki.RoleNode))))
	}
	c, err := transport.DialControl(cfg.Addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("--addr %s: %w", cfg.Addr, err)
	}
	return &Driver{cfg: cfg, client: c}, nil
}

// Close closes the control API client.
func (d *Driver) Close() error { return d.client.Close() }

// call is a context for one control API call.
func (d *Driver) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.cfg.CallTimeout)
}

// Listen opens endpoint, unix:///PATH (a socket left by an earlier run is removed) or
// tcp://HOST:PORT.
func Listen(endpoint string) (net.Listener, error) {
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		path := strings.TrimPrefix(endpoint, "unix://")
		if path == "" {
			return nil, fmt.Errorf("--endpoint %s: give unix:///PATH", endpoint)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("--endpoint %s: remove the old socket: %w", endpoint, err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return nil, fmt.Errorf("--endpoint %s: %w", endpoint, err)
		}
		return net.Listen("unix", path)
	case strings.HasPrefix(endpoint, "tcp://"):
		return net.Listen("tcp", strings.TrimPrefix(endpoint, "tcp://"))
	}
	return nil, fmt.Errorf("--endpoint %q: give unix:///PATH or tcp://HOST:PORT", endpoint)
}

// Server is a gRPC server with every service of d registered, each call logged when it fails.
func (d *Driver) Server() *grpc.Server {
	s := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if err != nil {
			d.cfg.Logf("%s: %v", info.FullMethod, err)
		}
		return resp, err
	}))
	csi.RegisterIdentityServer(s, d)
	csi.RegisterControllerServer(s, d)
	csi.RegisterNodeServer(s, d)
	return s
}

// GetPluginInfo names the driver.
func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: PluginName, VendorVersion: d.cfg.Version}, nil
}

// GetPluginCapabilities: a controller service, and volumes that grow while in use.
func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{
		{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}},
		{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE}}},
	}}, nil
}

// Probe is ready when the node at --addr answers its status.
func (d *Driver) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	ctx, cancel := d.call(ctx)
	defer cancel()
	if _, err := d.client.NodeStatus(ctx, &transport.StatusRequest{}); err != nil {
		d.cfg.Logf("probe: the node at %s does not answer: %v", d.cfg.Addr, err)
		return &csi.ProbeResponse{Ready: wrapperspb.Bool(false)}, nil
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
