// Package control is a node's control API: the gRPC handlers of
// transport.ControlServer (Server), who may call what (authorize, a pure
// rule, and the Gate that applies it to each call, logs the refusals once
// per peer and cause, and marks the calls a node forwards on someone's
// behalf), and the control port's Listener (bounded connections, TLS
// handshaken before the HTTP server sees them). A handler parses and
// checks the request, forwards it to the node that holds the volume when
// it names another, calls the node and converts the answer; what a call
// decides (a promotion, a switchover through raft, discarding a split
// brain's data) is the node's, behind the Node and Volume interfaces.
//
// It imports nothing of package node, which implements Node and imports
// it (layering_test.go): only transport, replication and internal
// packages, and neither bbolt, raft nor memberlist.
//
// gRPC serves each call on a goroutine of its own, and net/http each
// request: a Server's and a Gate's methods are called concurrently, and
// so call Node's and Volume's. A Listener's accept loop and handshakes run
// on goroutines of their own, and Accept and Close may be called from any.
// It declares no mutex: a Listener's admission counts are
// internal/connlimit's, whose Limiter mutex is a leaf.
package control
