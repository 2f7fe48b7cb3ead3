//go:build !deadlock

package lockorder

// Owner is the goroutine that owns some state: the only one that may
// change it. In a build with the deadlock tag (owner_deadlock.go) Check
// panics on any other goroutine; here it costs nothing. The zero Owner is
// owned by nobody yet; Claim makes the calling goroutine its owner, and
// Release ends the ownership (after it, Check passes everywhere: nobody
// changes the state concurrently with a goroutine that ended).
type Owner struct{}

// Claim makes the calling goroutine the owner.
func (*Owner) Claim() {}

// Release ends the ownership: the owner has ended.
func (*Owner) Release() {}

// Check panics, in a build with the deadlock tag, when the calling
// goroutine is not the owner while an owner runs; what and whose name the
// change (two strings, so that this build, where Check does nothing,
// builds no message).
func (*Owner) Check(what, whose string) {}
