package faultpath

import (
	"io"

	"github.com/replvol/replvol/internal/lockorder"
)

// Memory is an in-memory LUN for tests and benchmarks; Path hands out
// routes to it.
type Memory struct {
	mu   lockorder.RWMutex
	data []byte
}

// NewMemory returns a LUN of size bytes, all zero.
func NewMemory(size int64) *Memory { return &Memory{data: make([]byte, size)} }

// Path returns a new route named name to m. Closing it leaves m intact.
func (m *Memory) Path(name string) Inner { return &memoryPath{m: m, name: name} }

// ReadAt reads m directly, bypassing every path.
func (m *Memory) ReadAt(b []byte, off int64) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if off >= int64(len(m.data)) {
		return 0, io.EOF
	}
	n := copy(b, m.data[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt writes m directly, bypassing every path.
func (m *Memory) WriteAt(b []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off+int64(len(b)) > int64(len(m.data)) {
		return 0, io.ErrShortWrite
	}
	return copy(m.data[off:], b), nil
}

type memoryPath struct {
	m    *Memory
	name string
}

func (p *memoryPath) Name() string                             { return p.name }
func (p *memoryPath) ReadAt(b []byte, off int64) (int, error)  { return p.m.ReadAt(b, off) }
func (p *memoryPath) WriteAt(b []byte, off int64) (int, error) { return p.m.WriteAt(b, off) }
func (p *memoryPath) Sync() error                              { return nil }
func (p *memoryPath) Close() error                             { return nil }

func (p *memoryPath) Size() (int64, error) {
	p.m.mu.RLock()
	defer p.m.mu.RUnlock()
	return int64(len(p.m.data)), nil
}

func (p *memoryPath) Zero(off, length int64) error {
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	if off+length > int64(len(p.m.data)) {
		return io.ErrShortWrite
	}
	clear(p.m.data[off : off+length])
	return nil
}
