// Package fault injects faults behind the project's seams, as pebble's
// errorfs does: a Disk that fails, delays, holds, tears, drops or loses
// operations chosen by op and offset; a Link (net.Conn and net.Listener
// wrappers) that drops, delays and partitions a replication link; and the
// Point and Rule that the domain test helpers (mdtest, faultpath, nbdtest)
// build theirs on. It is for tests and benchmarks, and imports nothing of
// replvol. Every type may be used concurrently; an Injector is called
// concurrently and must not block (a Fault's Delay, Hang or Hold does).
package fault
