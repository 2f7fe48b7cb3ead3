// Package multipath is a userspace multipath block device: one LUN seen through N paths, IO routed by policy, failed
// IO retried on another path, failed paths probed and restored, IO queued for a bounded time when no path is left.
// It imports nothing of replvol but internal/clock and internal/lockorder; every exported method is safe for concurrent use (see OnChange for the one callback).
//
// # Label
//
// Paths are recognised as one LUN by a label replvol writes in the last whole 4 KiB block of the device (like
// GEOM's), at LabelOffset(size) = floor(size/4096)*4096 - 4096; the data is everything before it. Little-endian:
//
//	offset  size  field
//	     0    16  magic "REPLVOL-MPATH\0\0\0"
//	    16     4  format version, 1
//	    20     4  reserved, 0
//	    24    16  LUN UUID (never zero)
//	    40  4052  reserved, 0
//	  4092     4  CRC-32C (Castagnoli) of bytes 0..4091
//
// # Locks
//
// A Device's mu is taken alone: path IO runs outside it, and a path's rmw
// (the read-modify-write of an unaligned O_DIRECT write) is taken only
// inside that IO, never with the Device's mu. Under the Device's mu
// Config.OnChange is called (it must take no lock that is held while
// calling the Device) and the clock is read (internal/clock's Fake takes
// its own leaf mutex). Both are internal/lockorder's mutexes, checked by
// go test -tags deadlock.
package multipath
