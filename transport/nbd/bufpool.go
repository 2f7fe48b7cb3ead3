package nbd

import (
	"math/bits"
	"sync"
)

// Payload buffers come from one sync.Pool per power-of-two size class, 512 B to MaxRequestLength,
// so a steady stream of requests allocates nothing.
const (
	minBufferShift = 9
	maxBufferShift = 25 // 32 MiB == MaxRequestLength
)

var bufferPools [maxBufferShift - minBufferShift + 1]sync.Pool

func bufferClass(n int) int {
	if n <= 1<<minBufferShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufferShift
}

// getBuffer returns a buffer of length n (1 <= n <= MaxRequestLength). Its contents are garbage.
func getBuffer(n int) *[]byte {
	class := bufferClass(n)
	if b, ok := bufferPools[class].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(class+minBufferShift))
	return &b
}

func putBuffer(b *[]byte) {
	bufferPools[bufferClass(cap(*b))].Put(b)
}
