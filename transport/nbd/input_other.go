//go:build !linux

package nbd

import "net"

// socketHasInput is only implemented on Linux; elsewhere a drain takes a quiet client's
// socket as empty, and a request that arrived as the quiet time ran out ends with the
// connection (EOF) instead of NBD_ESHUTDOWN.
func socketHasInput(net.Conn) bool { return false }
