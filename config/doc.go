// Package config is the cluster file: its types (Config, NodeConfig,
// VolumeConfig, DiskConfig, TLSConfig), LoadConfig, which names every
// problem of a file at once with its line and field (load.go), and the
// size and duration syntax (ParseSize, ParseVolumeSize); LoadNodeConfig
// adds, in the same report, what only a node's host can check (files.go).
// It imports replication, metadata (the on-disk format's limits),
// multipath (its policy words) and internal/pki (to read TLS files),
// never node, transport, raft, memberlist or bbolt:
// node (which names its types as its own) and replctl's offline commands
// call it. A loaded Config is read-only; share it freely.
package config
