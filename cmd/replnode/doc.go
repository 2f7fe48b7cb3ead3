// Command replnode is the replvol daemon: one node of a cluster, started
// with the cluster's config file and its own name. It only wires flags to
// package node.
package main
