package node

import "github.com/replvol/replvol/config"

// The cluster file's types and loading are package config's; node names
// them as its own, so that its code and its callers read as before.
type (
	Config       = config.Config
	TLSConfig    = config.TLSConfig
	NodeConfig   = config.NodeConfig
	VolumeConfig = config.VolumeConfig
	DiskConfig   = config.DiskConfig
	PathConfig   = config.PathConfig
	PoolConfig   = config.PoolConfig
	Duration     = config.Duration
	ByteSize     = config.ByteSize
	VolumeSize   = config.VolumeSize
	Problem      = config.Problem
	ConfigError  = config.ConfigError
)

// NBD TLS policies, node roles and size: max (config's).
const (
	NBDTLSRequired = config.NBDTLSRequired
	NBDTLSOptional = config.NBDTLSOptional
	NBDTLSOff      = config.NBDTLSOff
	RoleData       = config.RoleData
	RoleWitness    = config.RoleWitness
	SizeMax        = config.SizeMax
)

// LoadConfig reads and validates a cluster configuration file
// (config.LoadConfig).
func LoadConfig(path string) (*Config, error) { return config.LoadConfig(path) }

// LoadNodeConfig is LoadConfig for the node named name, on its host: the
// file's problems and those of the files it names for the node (its TLS
// certificates), in one report (config.LoadNodeConfig).
func LoadNodeConfig(path, name string) (*Config, error) { return config.LoadNodeConfig(path, name) }

// ParseSize reads a size with an optional unit (config.ParseSize).
func ParseSize(s string) (int64, error) { return config.ParseSize(s) }

// ParseVolumeSize reads a volume's size as the config file's size: does
// (config.ParseVolumeSize).
func ParseVolumeSize(s string) (VolumeSize, error) { return config.ParseVolumeSize(s) }

// SinglePath returns a plain one-path disk (config.SinglePath).
func SinglePath(path string) DiskConfig { return config.SinglePath(path) }

// MultiPath returns a multipath disk over the given device paths
// (config.MultiPath).
func MultiPath(paths ...string) DiskConfig { return config.MultiPath(paths...) }
