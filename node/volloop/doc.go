// Package volloop is a volume's loop: the one goroutine that drives the
// volume's state machine (node/volstate) and owns what only the loop may
// change (node's peers' replication states). It is written twice over one
// step: Core, what the loop does with each message it takes (a drive
// posted, a drive resumed with the end of its wait off the loop, a call,
// news, the close), which never blocks and starts no goroutine; and Loop,
// production's runner, whose goroutine takes the messages of its inbox,
// its news and its close in order, hands each to its Core and runs each
// Wait the Core returns on a goroutine of its own, whose end comes back to
// the inbox. Package node runs a Loop per volume (Volume.loop); the
// simulation (node/sim) runs a Core per simulated node on its one
// goroutine, doing each Wait itself and handing its end back, so the
// drives it steps are taken as production's loop takes them.
//
// It imports node/volstate, internal/lockorder and the standard library:
// nothing of node, its sessions, the applier or the cluster (node's
// TestLayering).
//
// A Core is used by one goroutine at a time (the Loop's, or the
// simulation's); its drives' effects are called on that goroutine, or,
// for a Wait, on the goroutine that does it, never both at once. A Loop's
// methods may be called from any goroutine; Check from the one whose
// change it checks. newsMu, which guards a Loop's news, is a leaf: the
// code that tells or asks may hold any of its own mutexes (node's lock
// order, node/doc.go, names it v.loop's newsMu).
package volloop
