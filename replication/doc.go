// Package replication holds replvol's replication rules and data structures:
// the DRBD-style state names, the out-of-sync bitmap, write ordering for
// overlapping requests, the wire format of the replication stream and the
// pure decision of what a (re)connection must resync.
//
// It performs no I/O and imports none of the project's I/O packages
// (transport, node, web, metadata); node drives it, and config, metadata
// and backing use its types and words. Types document their own
// concurrency rules.
//
// Its two mutexes, a Bitmap's and a RangeLock's, are leaves
// (internal/lockorder's): nothing is taken or called under them; a
// RangeLock's waiters wait after unlocking.
package replication
