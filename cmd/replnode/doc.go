// Command replnode is the replvol daemon: one node of a cluster, started
// with the cluster's config file and its own name. It wires flags to
// package node, tells systemd when it is ready (notify.go), and on SIGHUP
// applies what changed in the config file as far as it can online
// (reload.go, through the node's own control API).
package main
