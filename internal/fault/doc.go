// Package fault injects faults behind the project's seams, as pebble's
// errorfs does: a Disk that fails, delays, holds, tears, drops or loses
// operations chosen by op and offset; a Link (net.Conn and net.Listener
// wrappers) that drops, delays and partitions a replication link; and the
// Point and Rule that the domain test helpers (mdtest, faultpath, nbdtest)
// build theirs on. It is for tests and benchmarks, and imports nothing of
// replvol but internal/lockorder. Every type may be used concurrently; an Injector is called
// concurrently and must not block (a Fault's Delay, Hang or Hold does).
//
// Lock order (internal/lockorder's mutexes): a Point's mu before its
// Rules' (the Point asks its injectors under it); a Link's mu and a
// Conn's mu are never held together (a Conn reads the Link's state after
// releasing its own, and a Link closes its Conns after releasing its
// mu); a Disk's mu is held while it writes back the pre-images on a
// crash, to the disk it is given. A Gate's mu is a leaf.
package fault
