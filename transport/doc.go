// Package transport is replvol's edge to the network: the replication
// stream (stream.go: one TCP connection per stream, mutual TLS over it
// with a tls: section, each frame a header and its bytes written in one
// go from the buffer it was built in and read into a pooled buffer of
// its size; no HTTP/2, no codec copies; the frame itself and its buffer
// pool are transport/frame, a leaf that links no network, so that the
// peer session and the simulation build frames without the wire), the
// gRPC control API (a
// JSON codec over the status model in api.go, over TLS or a unix socket,
// its messages bounded; the server's Authorize gate and the forwarding
// mark are here, the rule is the node's), and, in transport/nbd, the
// NBD server. It converts between the wire and Go values and holds no
// replication rules. Clients and servers here are safe for concurrent use
// except where a type says otherwise.
//
// Lock order (internal/lockorder's mutexes; go test -tags deadlock checks
// it): a ReplServer's mu closes its listeners and connections under it,
// whose Close may take internal/connlimit's Limiter mu or, in tests,
// internal/fault's; a stream's write mutex (wmu) is held while the frame
// is written to the connection (internal/fault's Conn takes its mutexes in
// Write). A ReplClient's mu and a Dialer's mu are leaves: streams are
// closed, and connections dialled, after unlocking.
package transport
