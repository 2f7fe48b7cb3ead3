// Package nbdclient is the NBD client replctl mount runs: the fixed newstyle handshake with
// NBD_OPT_STARTTLS and NBD_OPT_GO, then simple replies with many requests in flight on a
// connection, and a Pool of several connections when the server offers multi-conn (connected
// again when the export grew: Refresh); and a
// Follower, one connection made again to the server a Locator names when it breaks (replctl
// mount --follow), sending every request not answered again, in order.
// It imports nothing of the project but internal/lockorder; the methods of a Conn and of a Pool may be called from
// many goroutines at once.
//
// Its two mutexes are never held together: a Conn's mu (the calls in
// flight, the error) and wmu (one request written whole): the connection
// is closed, the calls in flight failed and a disconnect written after mu
// is released. A Follower's wmu (the order requests are written in) comes
// before its mu (the requests held); the reader of its connection takes mu
// only. A Pool's mu (which connections requests go to: shared by each
// request, exclusive while Refresh puts new ones in place) comes before
// its Conns' mutexes.
package nbdclient
