// Package nbdclient is the NBD client replctl mount runs: the fixed newstyle handshake with
// NBD_OPT_STARTTLS and NBD_OPT_GO, then simple replies with many requests in flight on a
// connection, and a Pool of several connections when the server offers multi-conn.
// It imports nothing of the project but internal/lockorder; the methods of a Conn and of a Pool may be called from
// many goroutines at once.
//
// Its two mutexes are never held together: a Conn's mu (the calls in
// flight, the error) and wmu (one request written whole): the connection
// is closed, the calls in flight failed and a disconnect written after mu
// is released.
package nbdclient
