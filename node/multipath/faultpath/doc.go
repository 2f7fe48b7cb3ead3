// Package faultpath wraps a multipath path to inject errors, latency,
// hangs, fail/recover schedules and a throughput limit, chosen per
// operation by a one-method Injector (as pebble's errorfs). For tests and
// benchmarks only. It imports nothing of replvol; all methods are safe for
// concurrent use, and an Injector is called concurrently.
package faultpath
