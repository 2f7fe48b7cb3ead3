// Package faultpath wraps a multipath path to inject errors, latency,
// hangs, fail/recover schedules and a throughput limit: the faults and
// the rules that choose them are package fault's, told in a path's terms.
// For tests and benchmarks only. It imports nothing of replvol but
// internal/fault and internal/lockorder; all methods are safe for concurrent use, and an
// Injector is called concurrently.
//
// Locks: a memory LUN's RWMutex and a throttled path's mu are leaves
// (internal/lockorder's): nothing is taken under them, and the throttle
// sleeps after unlocking.
package faultpath
