// Package testport picks loopback ports for tests whose processes restart
// on the same address. A port the kernel hands out for 127.0.0.1:0 lies
// in the ephemeral range, where any outgoing connection may take it while
// its node is down (a restart then fails with "address already in use"),
// so Pick chooses free ports below that range instead. A port is also free
// to bind while the node that uses it is down, so each pick is reserved
// across processes (a file per port under $TMPDIR/replvol-testport,
// removed when the test ends): the test processes of several packages,
// which go test runs at once, never pick a port another still uses.
package testport
