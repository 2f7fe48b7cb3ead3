// Package csidriver is replvol's Container Storage Interface driver, the services behind
// cmd/replcsi: one Driver implements CSI's Identity, Controller and Node services and is
// registered on one gRPC server (as the reference hostpath driver does). It keeps no state of
// its own: the controller asks the cluster's control API (transport.ControlClient) to create,
// delete, list and grow volumes; the node attaches a volume through replctl attach --follow
// (the FUSE helper and loop device that follow the primary), records what it attached in
// replctl's run directory, and reads what is staged and published from the kernel's mount
// table. Its pure rules (capacity rounding, parameters, pagination, codes) are in rules.go.
//
// The plugin's name is PluginName, replvol.csi.io: the CSIDriver object of
// deploy/kubernetes carries the same name.
package csidriver
