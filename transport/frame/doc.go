// Package frame is the replication stream's message, apart from the
// stream: a Frame, the pool its buffers come from, the stream header's
// length it keeps room for and the largest frame either end takes. It
// imports the standard library only (no gRPC, no connection), so that
// what builds and reads frames (the peer session, and through it the
// simulation) links no network; package transport carries frames over a
// connection and keeps these names as aliases.
package frame
