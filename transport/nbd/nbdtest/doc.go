// Package nbdtest helps test NBD servers: a small raw NBD client (written independently of package
// nbd, so the two do not share mistakes), Export doubles (memory, faulty, gated) and RequireTool.
// Their faults are package fault's.
// Clients are for one goroutine each; the Export doubles may be called concurrently.
//
// Its mutexes (a Client's, a MemExport's RWMutex) are leaves.
package nbdtest
