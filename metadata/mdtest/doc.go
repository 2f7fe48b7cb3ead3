// Package mdtest provides a fault-injecting, crashable in-memory device for
// tests of on-disk metadata: it keeps what was written apart from what was
// synced, so a simulated crash keeps only the synced bytes (and, if asked,
// the torn prefix of an unsynced write). It imports nothing of replvol.
package mdtest
