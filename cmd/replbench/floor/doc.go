// Command floor is replbench's floor target: a minimal replicated write in
// Go, so that every figure of the bench has the machine's and the
// language's limit beside it. It is not a competitor and not a product:
// no activity log, no bitmap, no TLS, no error handling beyond closing a
// connection.
//
//	floor serve -listen ADDR -file F -size N -peer ADDR   the primary: NBD
//	floor replica -listen ADDR -file F                    the second process
//
// The primary speaks enough of the NBD protocol for fio's nbd engine and
// nbdinfo (fixed newstyle handshake; NBD_OPT_GO, NBD_OPT_INFO and
// NBD_OPT_EXPORT_NAME; NBD_CMD_READ, WRITE, FLUSH and DISC; simple
// replies). Per NBD connection it dials the replica once. A WRITE is
// pwritten to its file, then sent framed (header + data, one write) to the
// replica, which pwrites it and acknowledges; the NBD reply goes out after
// the acknowledgement (protocol C). A FLUSH is fdatasynced locally and on
// the replica before its reply. Per connection one goroutine reads requests
// and another reads the replica's acknowledgements, which come in the
// order the requests were sent, and replies; a mutex serialises replies.
//
// Both print "ready" on stdout once they listen. It imports nothing of the
// project but internal/lockorder's mutex (a sync.Mutex in the build the
// bench runs). Lock order: session.mu is a leaf.
package main
