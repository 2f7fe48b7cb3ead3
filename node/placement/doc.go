// Package placement is the rule that chooses the nodes of a volume
// created at run time (LINSTOR's autoplace): the data nodes with the
// most free space in the pool, ties by name. It is pure: the node layer
// gathers each node's pools and calls Place; it does no I/O, imports
// nothing of the project but internal/human, and is safe for concurrent
// use.
package placement
