package nbd

import (
	"net"
	"syscall"
)

// socketHasInput reports whether bytes wait in conn's receive queue, without reading them and
// whatever conn's read deadline (recv with MSG_PEEK|MSG_DONTWAIT, through Control, which does
// not check the deadline as a read does).
func socketHasInput(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var n int
	var b [1]byte
	_ = raw.Control(func(fd uintptr) {
		n, _, _ = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return n > 0
}
