// Package lockorder is the mutex type of every package of the module: a
// sync.Mutex and sync.RWMutex in an ordinary build (lock.go), and in a
// build with the deadlock tag (lock_deadlock.go, make test-locks and make
// test) go-deadlock's, which records the order in which each goroutine
// takes the mutexes of the whole process (one detector for every package)
// and fails the process at the first inversion, printing both orders'
// stacks. Only the order is checked: a mutex waited on for long (a slow
// disk) is not a deadlock. The same build checks ownership: an Owner is
// the one goroutine that may change some state (a volume's loop owns its
// peers' states), and its Check panics on any other (owner.go,
// owner_deadlock.go).
//
// Each package that declares mutexes writes, in its doc.go, which of them
// may be held while taking which (its lock order, outermost first) and
// which are leaves, under which nothing is taken; the packages it calls
// while holding one of its own are part of that order. No non-test file
// of the module declares a sync.Mutex or sync.RWMutex
// (TestEveryMutexIsChecked). It imports nothing of the project.
package lockorder
