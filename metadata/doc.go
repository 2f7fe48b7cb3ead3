// Package metadata keeps a node's durable state: per volume, the epoch and
// primary it last agreed to, its data generation, whether it shut down
// cleanly, and an event history. It is a bbolt file owned by one node; a
// Store is safe for concurrent use.
//
// The out-of-sync bitmaps live in memory for now. The crash-safe on-disk
// layout (superblock, activity log, bitmaps) comes with the metadata issue;
// until then a node that did not shut down cleanly forgets its generation,
// so its peer gets a full resync instead of a wrong "UpToDate".
package metadata
