package nbd

import (
	"errors"
	"syscall"
)

// errnoFor maps an Export error to the NBD error sent to the client: the syscall.Errno in err's
// chain chooses it (EROFS and EACCES become EPERM, EDQUOT and EFBIG become ENOSPC, as proto.md
// asks); anything else is EIO.
func errnoFor(err error) uint32 {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return errnoIO
	}
	switch errno {
	case syscall.EPERM, syscall.EROFS, syscall.EACCES:
		return errnoPerm
	case syscall.ENOMEM:
		return errnoNoMem
	case syscall.EINVAL:
		return errnoInval
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG:
		return errnoNoSpace
	case syscall.EOVERFLOW:
		return errnoOverflow
	case syscall.ESHUTDOWN:
		return errnoShutdown
	}
	if errno == syscall.ENOTSUP || errno == syscall.EOPNOTSUPP {
		return errnoNotSup
	}
	return errnoIO
}
