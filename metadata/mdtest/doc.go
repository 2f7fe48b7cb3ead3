// Package mdtest provides a crashable in-memory device for tests of
// on-disk metadata: it keeps what was written apart from what was synced,
// so a simulated crash keeps only the synced bytes (and, if asked, the
// torn prefix of an unsynced write). Its faults are package fault's. It
// imports nothing of replvol but internal/fault and internal/lockorder; a Device may be used
// concurrently.
//
// Its Device's mu is held while the device's fault Point decides (the
// Point's and its Rules' mutexes, package fault's, come after it).
package mdtest
