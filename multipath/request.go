package multipath

import (
	"io"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/clock"
)

type op uint8

const (
	opRead op = iota
	opWrite
	opWriteSync
	opZero
	opSync
	opProbe
)

var opNames = [...]string{"read", "write", "write", "zero", "sync", "label read"}

func (o op) String() string { return opNames[o] }

const (
	reqPending uint32 = iota
	reqDone
	reqAbandoned
)

// request is one attempt of one IO on one path. The caller owns it until
// it gives up waiting (IOTimeout); from then on the worker does, and
// recycles it when the path finally answers.
type request struct {
	op     op
	ps     *pathState
	off    int64
	length int64
	buf    []byte  // a private copy: an abandoned IO never touches the caller's memory
	bufPtr *[]byte // buf's pool handle

	uuid UUID // opProbe's result
	err  error

	state atomic.Uint32
	done  chan struct{} // one signal when the worker finished and the caller still waits
	timer clock.Timer   // the IO timeout, on the Device's clock
}

func newRequest(c clock.Clock) *request {
	t := c.NewTimer(time.Hour)
	t.Stop()
	return &request{done: make(chan struct{}, 1), timer: t}
}

func (d *Device) getRequest(o op, ps *pathState, off, length int64) *request {
	r := d.reqs.Get().(*request)
	r.op, r.ps, r.off, r.length = o, ps, off, length
	r.state.Store(reqPending)
	return r
}

func (d *Device) putRequest(r *request) {
	putBuffer(r.bufPtr)
	r.ps, r.buf, r.bufPtr, r.err, r.uuid = nil, nil, nil, nil, UUID{}
	d.reqs.Put(r)
}

// attempt issues r and waits at most IOTimeout. It returns false when it
// gave up: r then belongs to the worker.
func (d *Device) attempt(r *request) bool {
	r.ps.submit(r)
	r.timer.Reset(d.cfg.IOTimeout)
	select {
	case <-r.done:
		r.timer.Stop()
		return true
	case <-r.timer.C():
		if r.state.CompareAndSwap(reqPending, reqAbandoned) {
			return false
		}
		<-r.done
		return true
	}
}

// submit hands r to an idle worker of the path, or starts one. Workers
// stay until Close; a hung path keeps only the workers it holds.
func (ps *pathState) submit(r *request) {
	select {
	case ps.queue <- r:
	default:
		go ps.work(r)
	}
}

func (ps *pathState) work(r *request) {
	for {
		ps.d.execute(r)
		select {
		case r = <-ps.queue:
		case <-ps.d.quit:
			return
		}
	}
}

func (d *Device) execute(r *request) {
	p := r.ps.path
	start := d.cfg.Clock.Now()
	var err error
	switch r.op {
	case opRead:
		var n int
		n, err = p.ReadAt(r.buf, r.off)
		if err == io.EOF && n == len(r.buf) {
			err = nil
		} else if err == nil && n < len(r.buf) {
			err = io.ErrUnexpectedEOF
		}
	case opWrite:
		var n int
		n, err = p.WriteAt(r.buf, r.off)
		if err == nil && n < len(r.buf) {
			err = io.ErrShortWrite
		}
	case opWriteSync:
		if sw, ok := p.(syncWriter); ok {
			err = sw.WriteAtSync(r.buf, r.off)
		} else if _, err = p.WriteAt(r.buf, r.off); err == nil {
			err = p.Sync()
		}
	case opZero:
		err = p.Zero(r.off, r.length)
	case opSync:
		err = p.Sync()
	case opProbe:
		r.uuid, err = readLabelAt(p, r.off, r.buf)
	}
	r.err = err
	if r.op == opProbe {
		d.probeDone(r.ps)
	} else {
		d.finish(r.ps, r.op, r.length, err, start, d.cfg.Clock.Now())
	}
	if r.state.CompareAndSwap(reqPending, reqDone) {
		r.done <- struct{}{}
	} else {
		d.putRequest(r) // abandoned by its caller
	}
}

// Buffers: 4 KiB-aligned (for O_DIRECT paths), pooled by power-of-two
// size from 4 KiB to 8 MiB.
const (
	minBufShift = 12
	maxBufShift = 23
)

var bufPools [maxBufShift - minBufShift + 1]sync.Pool

func bufClass(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufShift
}

func getBuffer(n int) *[]byte {
	if n > 1<<maxBufShift {
		b := alignedBuffer(n)
		return &b
	}
	c := bufClass(n)
	if v := bufPools[c].Get(); v != nil {
		bp := v.(*[]byte)
		*bp = (*bp)[:n]
		return bp
	}
	b := alignedBuffer(1 << (c + minBufShift))[:n]
	return &b
}

func putBuffer(bp *[]byte) {
	if bp == nil {
		return
	}
	c := cap(*bp)
	if c > 1<<maxBufShift || c&(c-1) != 0 {
		return
	}
	bufPools[bufClass(c)].Put(bp)
}
