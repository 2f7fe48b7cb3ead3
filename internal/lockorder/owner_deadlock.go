//go:build deadlock

package lockorder

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
)

// Owner is the goroutine that owns some state: the only one that may
// change it. In this build (the deadlock tag) Check panics on any other
// goroutine while the owner runs. The zero Owner is owned by nobody yet;
// Claim makes the calling goroutine its owner, and Release ends the
// ownership (after it, Check passes everywhere: nobody changes the state
// concurrently with a goroutine that ended).
type Owner struct {
	// id is the owner's goroutine id, 0 before Claim, -1 after Release.
	id atomic.Int64
}

// Claim makes the calling goroutine the owner.
func (o *Owner) Claim() { o.id.Store(goid()) }

// Release ends the ownership: the owner has ended.
func (o *Owner) Release() { o.id.Store(-1) }

// Check panics when the calling goroutine is not the owner while an
// owner runs; what and whose name the change.
func (o *Owner) Check(what, whose string) {
	id := o.id.Load()
	if id <= 0 {
		return
	}
	if me := goid(); me != id {
		panic(fmt.Sprintf("%s %s on goroutine %d: only its owner, goroutine %d, changes it", what, whose, me, id))
	}
}

// goid is the calling goroutine's id, from the first line of its stack
// ("goroutine 42 [running]:"). Slow (about a microsecond): this build
// checks, it does not serve.
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		if id, err := strconv.ParseInt(string(b[:i]), 10, 64); err == nil {
			return id
		}
	}
	panic("lockorder: no goroutine id in " + string(buf[:]))
}
