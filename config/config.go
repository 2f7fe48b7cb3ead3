package config

import (
	"crypto/sha256"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/multipath"
	"github.com/replvol/replvol/replication"
	"gopkg.in/yaml.v3"
)

// Config describes a whole cluster. Every node reads the same file and picks
// its own entry with --node.
type Config struct {
	Nodes   []NodeConfig   `yaml:"nodes"`
	Volumes []VolumeConfig `yaml:"volumes"`
	// Failover is auto (the default whenever the nodes' raft voters can
	// form a majority without any one of them: three or more) or off. It
	// needs raft and gossip addresses on every node.
	Failover string `yaml:"failover,omitempty"`
	// TLS makes every link mutual TLS with the cluster's own CA
	// (replctl certs init writes the files). Without it the cluster is
	// unauthenticated, and says so at start.
	TLS *TLSConfig `yaml:"tls,omitempty"`
}

// TLSConfig names the files of the cluster's PKI. In Cert and Key,
// {node} stands for the node's name.
type TLSConfig struct {
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	// GossipKey is memberlist's 32-byte key (needed with gossip).
	GossipKey string `yaml:"gossip_key,omitempty"`
	// NBD is required (the default: a client must STARTTLS with a
	// certificate of the CA), optional (plain clients too) or off.
	NBD string `yaml:"nbd,omitempty"`
}

// NBD TLS policies.
const (
	NBDTLSRequired = "required"
	NBDTLSOptional = "optional"
	NBDTLSOff      = "off"
)

// nodeTemplate is replaced by a node's name in TLSConfig.Cert and Key.
const nodeTemplate = "{node}"

// CertFor is node's certificate file.
func (t *TLSConfig) CertFor(node string) string {
	return strings.ReplaceAll(t.Cert, nodeTemplate, node)
}

// KeyFor is node's key file.
func (t *TLSConfig) KeyFor(node string) string { return strings.ReplaceAll(t.Key, nodeTemplate, node) }

// NBDPolicy is the NBD TLS policy, its default filled in.
func (t *TLSConfig) NBDPolicy() string {
	if t == nil {
		return NBDTLSOff
	}
	if t.NBD == "" {
		return NBDTLSRequired
	}
	return t.NBD
}

// Node roles.
const (
	RoleData    = "data"
	RoleWitness = "witness"
)

// NodeConfig is one node's identity and listen addresses.
type NodeConfig struct {
	Name string `yaml:"name"`
	// Control serves the gRPC control API, the web status page and /metrics.
	Control string `yaml:"control"`
	// Replication serves the peer replication stream.
	Replication string `yaml:"replication"`
	// NBD serves the volumes this node is primary for.
	NBD string `yaml:"nbd"`
	// StateDir holds the node's own state (bbolt). Default: next to the config
	// file, in state-NAME.
	StateDir string `yaml:"state_dir,omitempty"`
	// ID is the node's number in the on-disk metadata (default: its
	// position in nodes, from 1). It must never change.
	ID uint32 `yaml:"id,omitempty"`
	// Raft and Gossip are the addresses of the node's raft transport and
	// memberlist; give both on every node, or on none (then primaries
	// change only by switchover or --force).
	Raft   string `yaml:"raft,omitempty"`
	Gossip string `yaml:"gossip,omitempty"`
	// Role is data (the default: the node holds disks) or witness (no
	// disks, no NBD, no replication: a raft voter only).
	Role string `yaml:"role,omitempty"`
	// Pools are the node's storage pools, from which volumes created at
	// run time (replctl volume create) take their backing storage. A
	// pool added or removed takes effect on SIGHUP.
	Pools []PoolConfig `yaml:"pools,omitempty"`
}

// PoolConfig is one storage pool of a node: a directory that holds a
// sparse file per volume (Dir), or an LVM volume group (LVMVG), which
// this release accepts and reports but never places a volume in.
type PoolConfig struct {
	Name  string `yaml:"name"`
	Dir   string `yaml:"dir,omitempty"`
	LVMVG string `yaml:"lvm_vg,omitempty"`
}

// DefaultPool is the pool a volume is created in when none is named.
const DefaultPool = "default"

// Pool returns the node's pool named name.
func (n NodeConfig) Pool(name string) (PoolConfig, bool) {
	for _, p := range n.Pools {
		if p.Name == name {
			return p, true
		}
	}
	return PoolConfig{}, false
}

// IsWitness reports whether the node only votes.
func (n NodeConfig) IsWitness() bool { return n.Role == RoleWitness }

// Clustered reports whether the nodes run raft and memberlist.
func (c *Config) Clustered() bool {
	for _, n := range c.Nodes {
		if n.Raft == "" {
			return false
		}
	}
	return len(c.Nodes) > 0
}

// FailoverMode is what Failover means for this file: auto or off, and
// why when off.
func (c *Config) FailoverMode() (auto bool, why string) {
	switch {
	case !c.Clustered():
		return false, "no raft/gossip addresses in the config: primaries change by replctl primary (switchover or --force)"
	case c.Failover == "off":
		return false, "failover: off in the config"
	case len(c.Nodes) < 3:
		return false, fmt.Sprintf("%d raft voters cannot keep a quorum without any one of them: add a witness node (role: witness) for automatic failover", len(c.Nodes))
	}
	return true, ""
}

// VolumeConfig is one replicated volume.
type VolumeConfig struct {
	Name string `yaml:"name"`
	// Size in bytes, or with a unit (ParseSize: 1GB is decimal, 1GiB
	// and 1G binary; a decimal size is rounded up to a whole 4 KiB), or
	// max (SizeMax).
	Size VolumeSize `yaml:"size"`
	// Protocol is A (a write completes once it is written locally and
	// queued for the peers), B (once the peers received it) or C (once
	// the peers wrote it; the default). replctl adjust changes it online.
	Protocol string `yaml:"protocol"`
	// OnCongestion is what a primary does when a peer's send buffer is
	// full: block (wait for room), pull-ahead (protocol A: go Ahead, mark
	// instead of ship, catch up later; A's default) or disconnect.
	OnCongestion string `yaml:"on_congestion,omitempty"`
	// SendBuffer bounds the bytes queued for a peer and not acknowledged
	// (default 64MiB).
	SendBuffer ByteSize `yaml:"send_buffer,omitempty"`
	// MaxLag, when set, throttles the primary's writes while a connected
	// peer lags by this many bytes or more.
	MaxLag ByteSize `yaml:"max_lag,omitempty"`
	// ReadBalancing is where reads go: prefer-local (default),
	// round-robin, least-pending or when-congested-remote. A block out of
	// sync on a peer is never read from it.
	ReadBalancing string `yaml:"read_balancing,omitempty"`
	// Primary is the node that is primary when the cluster is first created.
	// After that, the primary is what the nodes agreed (replctl primary).
	Primary string `yaml:"primary"`
	// Disks maps a node name to that node's backing file or block device:
	// one path, or several paths to the same LUN (multipath).
	Disks map[string]DiskConfig `yaml:"disks"`
	// Metadata is internal (default: at the end of each backing device,
	// which shrinks the usable size) or external (disks.NODE.meta).
	Metadata string `yaml:"metadata,omitempty"`
	// ALExtents is the number of hot 4 MiB extents of the activity log
	// (default 1237), fixed when the metadata is created.
	ALExtents int `yaml:"al_extents,omitempty"`
	// ResyncRate caps resync in bytes per second (e.g. 100MiB); 0, the
	// default, caps nothing: resync runs as fast as the link and disks
	// allow, and yields on its own while applications write.
	ResyncRate ByteSize `yaml:"resync_rate,omitempty"`
	// Csums makes resync compare block checksums first and send only the
	// blocks that differ (DRBD's csums-alg): less traffic on a slow link,
	// a read of both disks either way.
	Csums bool `yaml:"csums,omitempty"`
	// Checksums is on or off: a CRC-32C of every 4 KiB block, computed
	// where a write enters, verified by each peer before it writes and
	// stored in the metadata (docs/integrity.md). Unset means on for the
	// metadata this version creates, while a disk whose metadata has no
	// checksum area runs on without them; on, written out, also turns
	// them on for such a disk when its node starts the volume (its
	// metadata gains the area, and the sums are built in the background);
	// off keeps an existing area unused.
	Checksums string `yaml:"checksums,omitempty"`
	// ScrubInterval, when set (e.g. 7d, 24h), makes each node start a
	// scrub of its disk of the volume by itself (replctl scrub, at the
	// default rate) once its last finished scrub is older than this; a
	// node that never scrubbed it counts from when it first ran the
	// volume with the setting. Unset or 0: no scrub but the operator's.
	ScrubInterval Duration `yaml:"scrub_interval,omitempty"`
	// BadBlocksMax is how many blocks of its disk a node lists as bad
	// (their good copy, from a peer, could not be written over them; they
	// are read from a peer from then on) before it detaches the disk
	// instead (docs/integrity.md). Unset: DefaultBadBlocksMax (64); 0
	// detaches the disk at the first such block; at most MaxBadBlocksMax.
	// A node reads it when it starts the volume.
	BadBlocksMax *int `yaml:"bad_blocks_max,omitempty"`
	// OnPromote and OnDemote are commands run (through /bin/sh -c) after
	// this node became the volume's primary and after it stopped being
	// it; they get REPLVOL_VOLUME, REPLVOL_NODE, REPLVOL_EPOCH and
	// REPLVOL_EXPORT (the NBD URI) in their environment.
	OnPromote string `yaml:"on_promote,omitempty"`
	OnDemote  string `yaml:"on_demote,omitempty"`
	// PeerTimeout is how long a peer may answer nothing (not even the ack
	// of a heartbeat) before the primary gives up on it and marks what it
	// misses in its bitmap instead of waiting (DRBD's timeout); default 2s.
	// A hung peer costs writes at most this long, plus a heartbeat.
	PeerTimeout Duration `yaml:"peer_timeout,omitempty"`
	// AfterSB is what happens when two nodes both took writes as primary:
	// disconnect (default: the operator decides), discard-younger-primary,
	// discard-least-changes or discard-zero-changes.
	AfterSB string `yaml:"after_sb,omitempty"`

	// Pool is the storage pool of a volume created at run time (recorded
	// in raft, never written in the file); "" for a volume of the file.
	Pool string `yaml:"-"`
}

// FromAPI reports whether the volume was created at run time from a
// storage pool rather than listed in the cluster file.
func (v VolumeConfig) FromAPI() bool { return v.Pool != "" }

// ChecksumsOn reports whether metadata created for the volume gets a
// checksum area: checksums is on, or unset.
func (v VolumeConfig) ChecksumsOn() bool { return v.Checksums != "off" }

// DefaultBadBlocksMax is bad_blocks_max when unset.
const DefaultBadBlocksMax = 64

// MaxBadBlocksMax bounds bad_blocks_max: the metadata holds
// metadata.MaxBadBlocks entries, and the rest keep the blocks found
// unrecoverable across a restart.
const MaxBadBlocksMax = 256

// The list must leave room in the metadata: this fails to compile if not.
var _ [metadata.MaxBadBlocks - MaxBadBlocksMax]struct{}

// BadBlocksMaxOrDefault is the volume's bad_blocks_max, or its default.
func (v VolumeConfig) BadBlocksMaxOrDefault() int {
	if v.BadBlocksMax == nil {
		return DefaultBadBlocksMax
	}
	return *v.BadBlocksMax
}

// External reports whether the volume keeps its metadata in separate files.
func (v VolumeConfig) External() bool { return v.Metadata == "external" }

// VolumeUUID identifies the volume in its on-disk metadata; a disk whose
// metadata names another volume is refused.
func (v VolumeConfig) VolumeUUID() metadata.VolumeUUID {
	sum := sha256.Sum256([]byte("replvol volume " + v.Name))
	var u metadata.VolumeUUID
	copy(u[:], sum[:])
	return u
}

// Volume returns the volume named name, or nil.
func (c *Config) Volume(name string) *VolumeConfig {
	for i := range c.Volumes {
		if c.Volumes[i].Name == name {
			return &c.Volumes[i]
		}
	}
	return nil
}

// NodeName returns the name of the node with metadata id id.
func (c *Config) NodeName(id uint32) string {
	for _, n := range c.Nodes {
		if c.NodeID(n.Name) == id {
			return n.Name
		}
	}
	return ""
}

// NodeID returns a node's metadata id.
func (c *Config) NodeID(name string) uint32 {
	for i, n := range c.Nodes {
		if n.Name == name {
			if n.ID != 0 {
				return n.ID
			}
			return uint32(i + 1)
		}
	}
	return 0
}

// DiskConfig is one node's backing LUN for a volume. In YAML it is either a
// plain path ("/dev/sdb") or a mapping with several paths and multipath
// settings.
type DiskConfig struct {
	Paths []PathConfig `yaml:"paths"`
	// Meta is the external metadata file or device (metadata: external).
	Meta string `yaml:"meta,omitempty"`
	// Policy is failover (default), round-robin, queue-length, service-time
	// or active-read.
	Policy string `yaml:"policy,omitempty"`
	// RRMinIO is how many IOs round-robin sends down a path before it
	// switches (default 100).
	RRMinIO int `yaml:"rr_min_io,omitempty"`
	// CheckInterval is how often failed paths are probed (default 5s).
	CheckInterval Duration `yaml:"check_interval,omitempty"`
	// Failback is immediate (default), manual, or a delay such as 30s.
	Failback string `yaml:"failback,omitempty"`
	// NoPathRetry is how many check intervals IO queues when no path is
	// left (default: 30 s worth); -1 fails at once.
	NoPathRetry int `yaml:"no_path_retry,omitempty"`
	// IOTimeout bounds one IO on one path (default 5s).
	IOTimeout Duration `yaml:"io_timeout,omitempty"`
	// ReinstateHoldoff is the least time between two reinstatements of a
	// flapping path (default 1m).
	ReinstateHoldoff Duration `yaml:"reinstate_holdoff,omitempty"`
	// Balance is by-group (the default when paths have groups: spread the
	// active paths of this node's LUNs evenly over the groups) or none.
	Balance string `yaml:"balance,omitempty"`

	multipath bool // written as a mapping: paths carry a replvol label
}

// PathConfig is one path to a LUN.
type PathConfig struct {
	Name  string `yaml:"name"`
	Path  string `yaml:"path"`
	Group string `yaml:"group,omitempty"`
}

// Multipath reports whether the disk is a multipath device (its paths
// carry a replvol label that proves they reach one LUN).
func (d DiskConfig) Multipath() bool { return d.multipath }

// SinglePath returns a plain one-path disk.
func SinglePath(path string) DiskConfig {
	return DiskConfig{Paths: []PathConfig{{Name: "p0", Path: path}}}
}

// MultiPath returns a multipath disk over the given device paths, named
// p0, p1, ...
func MultiPath(paths ...string) DiskConfig {
	d := DiskConfig{multipath: true}
	for i, p := range paths {
		d.Paths = append(d.Paths, PathConfig{Name: fmt.Sprintf("p%d", i), Path: p})
	}
	return d
}

type plainDisk DiskConfig

// diskYAML is a disk written as a mapping.
type diskYAML struct {
	plainDisk `yaml:",inline"`
	// Path is a single path: a plain disk.
	Path string `yaml:"path"`
}

// UnmarshalYAML accepts a plain path, a mapping with one path (and, say,
// meta), or a mapping with a list of paths (multipath).
func (d *DiskConfig) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*d = SinglePath(n.Value)
		return nil
	}
	var p diskYAML
	if err := n.Decode(&p); err != nil {
		return err
	}
	*d = DiskConfig(p.plainDisk)
	switch {
	case p.Path != "" && len(d.Paths) > 0:
		return fmt.Errorf("line %d: give either path or paths, not both", n.Line)
	case p.Path != "":
		d.Paths = []PathConfig{{Name: "p0", Path: p.Path}}
		return nil
	}
	d.multipath = true
	for i := range d.Paths {
		if d.Paths[i].Name == "" {
			d.Paths[i].Name = fmt.Sprintf("p%d", i)
		}
	}
	return nil
}

// MarshalYAML writes a plain disk as its path.
func (d DiskConfig) MarshalYAML() (any, error) {
	if !d.multipath && len(d.Paths) == 1 && d.Meta == "" {
		return d.Paths[0].Path, nil
	}
	if !d.multipath && len(d.Paths) == 1 {
		return struct {
			Path string `yaml:"path"`
			Meta string `yaml:"meta,omitempty"`
		}{d.Paths[0].Path, d.Meta}, nil
	}
	return plainDisk(d), nil
}

// Duration is a time.Duration that YAML spells as "5s".
type Duration time.Duration

// UnmarshalYAML parses a Go duration.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*d = v
	return nil
}

// parseDuration parses a Go duration (5s, 500ms, 1h30m), which may begin
// with whole days (7d, 1d12h).
func parseDuration(s string) (Duration, error) {
	bad := fmt.Errorf("%q: want a duration such as 5s, 500ms or 7d", s)
	var days time.Duration
	rest := s
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.ParseInt(strings.TrimPrefix(s[:i], "-"), 10, 32)
		if err != nil {
			return 0, bad
		}
		days, rest = time.Duration(n)*24*time.Hour, s[i+1:]
		if strings.HasPrefix(s, "-") {
			days = -days
		}
	}
	if rest == "" {
		return Duration(days), nil
	}
	v, err := time.ParseDuration(rest)
	if err != nil || (days != 0 && (strings.HasPrefix(rest, "-") || strings.HasPrefix(rest, "+"))) {
		return 0, bad
	}
	if days < 0 {
		v = -v
	}
	return Duration(days + v), nil
}

// MarshalYAML writes the duration as text.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// ByteSize is a size in bytes that YAML may spell as 1073741824 or "1GiB".
type ByteSize int64

// UnmarshalYAML accepts an integer or a size with a unit (ParseSize).
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseByteSize(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*b = v
	return nil
}

func parseByteSize(s string) (ByteSize, error) {
	v, err := ParseSize(s)
	return ByteSize(v), err
}

// VolumeSize is a volume's size in bytes: a multiple of 4 KiB, or
// SizeMax.
type VolumeSize int64

// SizeMax is size: max, the largest size the disks hold after their
// metadata. A node can only measure its own disk: each node takes, when
// it first creates the volume, the largest size its disk holds, and
// records it; from then on the volume is that size on that node, whatever
// its disk grows to. Nodes whose disks give different sizes do not
// replicate (the peer is refused, naming both sizes and the fix).
const SizeMax VolumeSize = -1

// UnmarshalYAML accepts what ParseSize does; a size in decimal units
// (1GB is 10^9 bytes) is rounded up to a whole 4 KiB block, as LVM rounds
// a size up to its extents.
func (s *VolumeSize) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseVolumeSize(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*s = v
	return nil
}

// MarshalYAML writes the size as a byte count, or max.
func (s VolumeSize) MarshalYAML() (any, error) {
	if s == SizeMax {
		return "max", nil
	}
	return int64(s), nil
}

// ParseVolumeSize reads a volume's size as the config file's size: does:
// ParseSize's units, a size in decimal units rounded up to a whole 4 KiB,
// or max (SizeMax).
func ParseVolumeSize(s string) (VolumeSize, error) { return parseVolumeSize(s) }

func parseVolumeSize(s string) (VolumeSize, error) {
	if strings.EqualFold(strings.TrimSpace(s), "max") {
		return SizeMax, nil
	}
	v, err := ParseSize(s)
	if err != nil {
		return 0, err
	}
	if _, unit := splitSize(s); len(unit) == 2 && unit[1] == 'b' {
		v = (v + metadata.MDBlockSize - 1) / metadata.MDBlockSize * metadata.MDBlockSize
	}
	return VolumeSize(v), nil
}

// splitSize splits a size into its number and its unit (lower case).
func splitSize(s string) (num, unit string) {
	in := strings.TrimSpace(s)
	num = strings.TrimRight(in, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
	return strings.TrimSpace(num), strings.ToLower(strings.TrimSpace(in[len(num):]))
}

// ParseSize reads a size: a number of bytes, possibly with a fraction,
// and an optional unit, in any case: B; K, M, G, T, P or KiB ... PiB,
// binary (powers of 1024: a bare M is a MiB, as in dd and DRBD); KB, MB,
// GB, TB, PB, decimal (powers of 1000: 1GB is 10^9 bytes, as disk
// vendors count). "1.5GiB", "512M", "1GB", "4096". The result must be a
// whole number of bytes.
func ParseSize(s string) (int64, error) {
	num, unit := splitSize(s)
	mult, known := sizeUnit(unit)
	bad := fmt.Errorf("size %q: want a number of bytes with an optional unit, such as 1GB, 1.5GiB, 512MiB or 4096", s)
	if !known || num == "" || strings.ContainsAny(num, "eE+-/") {
		return 0, bad
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, bad
	}
	r.Mul(r, new(big.Rat).SetInt(mult))
	if !r.IsInt() {
		return 0, fmt.Errorf("size %q is not a whole number of bytes", s)
	}
	n := r.Num()
	if !n.IsInt64() || n.Int64() > 1<<62 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n.Int64(), nil
}

// sizeUnit is the multiplier of one of ParseSize's units (lower case).
func sizeUnit(unit string) (*big.Int, bool) {
	if unit == "" || unit == "b" {
		return big.NewInt(1), true
	}
	for i, p := range []string{"k", "m", "g", "t", "p"} {
		switch unit {
		case p, p + "ib":
			return new(big.Int).Lsh(big.NewInt(1), uint(10*(i+1))), true
		case p + "b":
			return new(big.Int).Exp(big.NewInt(1000), big.NewInt(int64(i+1)), nil), true
		}
	}
	return nil, false
}

// LoadConfig reads and validates a cluster configuration file. A file
// that does not load gives a *ConfigError naming every problem, one per
// line, each with its line in the file and the field's path.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// Marshal renders the configuration as YAML.
func (c *Config) Marshal() ([]byte, error) { return yaml.Marshal(c) }

// MarshalYAML writes sizes as plain byte counts.
func (b ByteSize) MarshalYAML() (any, error) { return int64(b), nil }

// Node returns the named node's entry.
func (c *Config) Node(name string) (NodeConfig, bool) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return NodeConfig{}, false
}

// Validate reports every problem in the config at once, as a
// *ConfigError; each problem names the field and says what is wrong.
func (c *Config) Validate() error {
	if ps := c.problems(); len(ps) > 0 {
		return &ConfigError{Problems: ps}
	}
	return nil
}

// problems lists what is wrong with the config's values.
func (c *Config) problems() []Problem {
	var ps []Problem
	bad := func(field, format string, args ...any) {
		ps = append(ps, Problem{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if len(c.Nodes) == 0 {
		bad("nodes", "missing: list at least one node with name, control, replication and nbd")
	}
	if t := c.TLS; t != nil {
		for _, f := range []struct{ field, value, what string }{
			{"tls.ca", t.CA, "the cluster CA's certificate, e.g. /etc/replvol/tls/ca.crt"},
			{"tls.cert", t.Cert, "each node's certificate, e.g. /etc/replvol/tls/{node}.crt"},
			{"tls.key", t.Key, "each node's key, e.g. /etc/replvol/tls/{node}.key"},
		} {
			if f.value == "" {
				bad(f.field, "missing: give %s (replctl certs init writes them)", f.what)
			}
		}
		if len(c.Nodes) > 1 && t.Cert != "" && !strings.Contains(t.Cert, nodeTemplate) {
			bad("tls.cert", "%q names one file for every node: put {node} in it, e.g. /etc/replvol/tls/{node}.crt", t.Cert)
		}
		if len(c.Nodes) > 1 && t.Key != "" && !strings.Contains(t.Key, nodeTemplate) {
			bad("tls.key", "%q names one file for every node: put {node} in it, e.g. /etc/replvol/tls/{node}.key", t.Key)
		}
		switch t.NBD {
		case "", NBDTLSRequired, NBDTLSOptional, NBDTLSOff:
		default:
			bad("tls.nbd", "%q: want required, optional or off", t.NBD)
		}
		gossip := false
		for _, n := range c.Nodes {
			gossip = gossip || n.Gossip != ""
		}
		if gossip && t.GossipKey == "" {
			bad("tls.gossip_key", "missing: the nodes gossip, so give memberlist's key, e.g. /etc/replvol/tls/gossip.key")
		}
	}
	names := map[string]bool{}
	addrs := map[string]string{}
	for i, n := range c.Nodes {
		f := fmt.Sprintf("nodes[%d]", i)
		checkName(bad, f+".name", n.Name, names, "nodes")
		switch n.Role {
		case "", RoleData, RoleWitness:
		default:
			bad(f+".role", "%q: want data or witness", n.Role)
		}
		if (n.Raft == "") != (n.Gossip == "") {
			bad(f+".raft", "give raft and gossip together (both HOST:PORT), or neither")
		}
		if n.IsWitness() && n.Raft == "" {
			bad(f+".raft", "missing: a witness only votes in raft; give raft and gossip addresses")
		}
		validatePools(f, n, bad)
		for _, a := range []struct{ field, value, what string }{
			{"control", n.Control, ""}, {"replication", n.Replication, "replicates nothing"}, {"nbd", n.NBD, "serves no NBD"}, {"raft", n.Raft, ""}, {"gossip", n.Gossip, ""},
		} {
			ff := f + "." + a.field
			if n.IsWitness() && a.what != "" {
				// A witness listens on neither: an address given here
				// looks served, and is not.
				if a.value != "" {
					bad(ff, "%q: a witness holds no disk and %s, so it listens on no %s address: remove this line, or make %s a data node (role: data, with a disk in each volume)",
						a.value, a.what, a.field, n.Name)
				}
				continue
			}
			optional := a.field == "raft" || a.field == "gossip"
			if a.value == "" && optional {
				continue
			}
			if a.value == "" {
				bad(ff, "missing: give HOST:PORT")
				continue
			}
			host, port, err := net.SplitHostPort(a.value)
			if err != nil {
				bad(ff, "%q is not HOST:PORT", a.value)
				continue
			}
			if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
				bad(ff, "%q: port must be 0-65535", a.value)
				continue
			}
			if port != "0" {
				key := host + ":" + port
				if other, dup := addrs[key]; dup {
					bad(ff, "%q is also used by %s", a.value, other)
				}
				addrs[key] = ff
			}
		}
	}
	withRaft := 0
	witnesses := map[string]bool{}
	for _, n := range c.Nodes {
		if n.Raft != "" {
			withRaft++
		}
		if n.IsWitness() {
			witnesses[n.Name] = true
		}
	}
	if withRaft > 0 && withRaft < len(c.Nodes) {
		bad("nodes", "%d of %d nodes have raft and gossip addresses: give them on every node (cluster membership decides the primary) or on none", withRaft, len(c.Nodes))
	}
	switch c.Failover {
	case "", "auto", "off":
	default:
		bad("failover", "%q: want auto or off", c.Failover)
	}
	pools := false
	for _, n := range c.Nodes {
		pools = pools || len(n.Pools) > 0
	}
	if len(c.Volumes) == 0 && !pools {
		bad("volumes", "missing: list at least one volume, or give the data nodes storage pools (pools: [{name: default, dir: /var/lib/replvol/pool}]) to create volumes with replctl volume create")
	}
	vols := map[string]bool{}
	for i, v := range c.Volumes {
		f := fmt.Sprintf("volumes[%d]", i)
		checkName(bad, f+".name", v.Name, vols, "volumes")
		if v.Size <= 0 && v.Size != SizeMax {
			bad(f+".size", "missing: give the volume size, e.g. 1GiB, or max (the largest size every disk holds after its metadata)")
		} else if v.Size != SizeMax && v.Size%4096 != 0 {
			bad(f+".size", "%d is not a multiple of 4096", v.Size)
		}
		switch v.Protocol {
		case "A", "B", "C", "":
		default:
			bad(f+".protocol", "%q: want A, B or C", v.Protocol)
		}
		if v.OnCongestion != "" {
			if p, err := replication.ParseOnCongestion(v.OnCongestion); err != nil {
				bad(f+".on_congestion", "%v", err)
			} else if err := replication.CheckOnCongestion(v.ProtocolOrDefault(), p); err != nil {
				bad(f+".on_congestion", "%v", err)
			}
		}
		if v.SendBuffer < 0 || (v.SendBuffer > 0 && v.SendBuffer < 1<<20) {
			bad(f+".send_buffer", "%d: want at least 1MiB", v.SendBuffer)
		}
		if v.MaxLag < 0 {
			bad(f+".max_lag", "%d: want a size, or 0 for no limit", v.MaxLag)
		}
		if _, err := replication.ParseReadBalancing(v.ReadBalancing); err != nil {
			bad(f+".read_balancing", "%v", err)
		}
		switch v.Checksums {
		case "", "on", "off":
		default:
			bad(f+".checksums", "%q: want on or off", v.Checksums)
		}
		if v.Primary == "" {
			bad(f+".primary", "missing: name the node that is primary when the volume is created")
		} else if !names[v.Primary] {
			bad(f+".primary", "%q is not a node in nodes", v.Primary)
		}
		if len(v.Disks) == 0 {
			bad(f+".disks", "missing: map each node name to its backing file or device")
		}
		keys := make([]string, 0, len(v.Disks))
		for k := range v.Disks {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !names[k] {
				bad(f+".disks."+k, "%q is not a node in nodes", k)
				continue
			}
			if witnesses[k] {
				bad(f+".disks."+k, "%q is a witness: it holds no disks", k)
				continue
			}
			validateDisk(f+".disks."+k, v.Disks[k], bad)
		}
		switch v.Metadata {
		case "", "internal":
		case "external":
			for _, k := range keys {
				if v.Disks[k].Meta == "" {
					bad(f+".disks."+k+".meta", "missing: metadata: external needs a metadata file or device per node")
				}
			}
		default:
			bad(f+".metadata", "%q: want internal or external", v.Metadata)
		}
		if _, err := replication.ParseAfterSplitBrain(v.AfterSB); err != nil {
			bad(f+".after_sb", "%v", err)
		}
		if v.ALExtents != 0 && (v.ALExtents < metadata.MinALExtents || v.ALExtents > metadata.MaxALExtents) {
			bad(f+".al_extents", "%d: want %d..%d", v.ALExtents, metadata.MinALExtents, metadata.MaxALExtents)
		}
		if si := time.Duration(v.ScrubInterval); si != 0 && si < minScrubInterval {
			bad(f+".scrub_interval", "%s: want an hour or more (e.g. 7d or 24h), or leave it out for no scrub but the operator's", si)
		}
		if m := v.BadBlocksMax; m != nil && (*m < 0 || *m > MaxBadBlocksMax) {
			bad(f+".bad_blocks_max", "%d: want 0..%d (0: detach the disk at the first block that cannot be rewritten), or leave it out for %d", *m, MaxBadBlocksMax, DefaultBadBlocksMax)
		}
		if v.PeerTimeout != 0 && (time.Duration(v.PeerTimeout) < minPeerTimeout || time.Duration(v.PeerTimeout) > maxPeerTimeout) {
			bad(f+".peer_timeout", "%s: want %s..%s", time.Duration(v.PeerTimeout), minPeerTimeout, maxPeerTimeout)
		}
		if _, ok := v.Disks[v.Primary]; v.Primary != "" && names[v.Primary] && !ok {
			bad(f+".disks", "the primary %q has no disk", v.Primary)
		}
	}
	return ps
}

// validatePools checks node n's pools (field f is the node's): each
// named once, with either an absolute dir or an LVM volume group, and
// none on a witness.
func validatePools(f string, n NodeConfig, bad func(field, format string, args ...any)) {
	if n.IsWitness() && len(n.Pools) > 0 {
		bad(f+".pools", "a witness holds no disks, so it has no storage pools: remove pools from %s, or make it a data node (role: data)", n.Name)
		return
	}
	names := map[string]bool{}
	dirs := map[string]string{}
	for i, p := range n.Pools {
		pf := fmt.Sprintf("%s.pools[%d]", f, i)
		checkName(bad, pf+".name", p.Name, names, "pools of "+n.Name)
		switch {
		case p.Dir != "" && p.LVMVG != "":
			bad(pf, "give either dir (a directory of sparse files) or lvm_vg (an LVM volume group), not both")
		case p.Dir == "" && p.LVMVG == "":
			bad(pf, "missing: give dir, an absolute directory for the volumes' sparse files (e.g. /var/lib/replvol/pool), or lvm_vg, an LVM volume group")
		case p.Dir != "" && !filepath.IsAbs(p.Dir):
			bad(pf+".dir", "%q is a relative path: give an absolute directory, e.g. /var/lib/replvol/pool", p.Dir)
		case p.Dir != "":
			clean := filepath.Clean(p.Dir)
			if other, dup := dirs[clean]; dup {
				bad(pf+".dir", "%q is also the directory of pool %s: give each pool a directory of its own", p.Dir, other)
			}
			dirs[clean] = p.Name
		case !validName(p.LVMVG):
			bad(pf+".lvm_vg", "%q is not a volume group name: use letters, digits, '-' and '_' only", p.LVMVG)
		}
	}
}

func validateDisk(f string, d DiskConfig, bad func(field, format string, args ...any)) {
	if len(d.Paths) == 0 {
		if d.multipath {
			f += ".paths" // written as a mapping
		}
		bad(f, "missing: give a file or device path, or paths: [{name, path, group}]")
		return
	}
	seen := map[string]bool{}
	for i, p := range d.Paths {
		pf := fmt.Sprintf("%s.paths[%d]", f, i)
		if p.Path == "" {
			if d.multipath {
				bad(pf+".path", "missing: give a file or device path")
			} else {
				bad(f, "missing: give a file or device path")
			}
		}
		if seen[p.Name] {
			bad(pf+".name", "%q is used by two paths", p.Name)
		}
		seen[p.Name] = true
	}
	if d.Policy != "" {
		if _, err := multipath.ParsePolicy(d.Policy); err != nil {
			bad(f+".policy", "%q: want failover, round-robin, queue-length, service-time or active-read", d.Policy)
		}
	}
	if d.Failback != "" {
		if _, err := multipath.ParseFailback(d.Failback); err != nil {
			bad(f+".failback", "%q: want immediate, manual or a delay such as 30s", d.Failback)
		}
	}
	if d.RRMinIO < 0 {
		bad(f+".rr_min_io", "%d: want a positive count", d.RRMinIO)
	}
	if d.NoPathRetry < -1 {
		bad(f+".no_path_retry", "%d: want -1 (fail at once), 0 (default) or a count of check intervals", d.NoPathRetry)
	}
	switch d.Balance {
	case "", "by-group", "none":
	default:
		bad(f+".balance", "%q: want by-group or none", d.Balance)
	}
}

// minScrubInterval is the shortest scrub_interval: a scrub reads the whole
// disk.
const minScrubInterval = time.Hour

// Bounds and default of peer_timeout.
const (
	defaultPeerTimeout = 2 * time.Second
	minPeerTimeout     = 200 * time.Millisecond
	maxPeerTimeout     = time.Minute
)

// PeerTimeoutOrDefault is the volume's peer_timeout, or its default.
func (v VolumeConfig) PeerTimeoutOrDefault() time.Duration {
	if v.PeerTimeout == 0 {
		return defaultPeerTimeout
	}
	return time.Duration(v.PeerTimeout)
}

// ProtocolOrDefault returns the volume's replication protocol, C when unset.
func (v VolumeConfig) ProtocolOrDefault() string {
	if v.Protocol == "" {
		return "C"
	}
	return v.Protocol
}

// checkName is the one rule for the names of nodes and of volumes: given,
// of letters, digits, '-' and '_' only, and not used by two of them (seen
// holds the names before this one, of what; name joins it).
func checkName(bad func(field, format string, args ...any), field, name string, seen map[string]bool, what string) {
	if name == "" {
		bad(field, "missing")
	} else if !validName(name) {
		bad(field, "%q: use letters, digits, '-' and '_' only", name)
	} else if seen[name] {
		bad(field, "%q is used by two %s", name, what)
	}
	seen[name] = true
}

func validName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return s != ""
}
