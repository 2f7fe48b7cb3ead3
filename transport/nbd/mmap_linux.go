package nbd

import "syscall"

// mapBuffer returns size bytes of private anonymous memory, zero-filled; the kernel gives it
// pages only as they are touched.
func mapBuffer(size int) ([]byte, error) {
	return syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
}

// discardPages gives b's pages back to the OS; b stays mapped and reads back as zeroes.
func discardPages(b []byte) {
	if err := syscall.Madvise(b, syscall.MADV_DONTNEED); err != nil {
		panic("nbd: madvise(MADV_DONTNEED) of a pool buffer: " + err.Error())
	}
}

// unmapBuffer unmaps b, a whole mapping from mapBuffer.
func unmapBuffer(b []byte) {
	if err := syscall.Munmap(b); err != nil {
		panic("nbd: munmap of a pool buffer: " + err.Error())
	}
}
