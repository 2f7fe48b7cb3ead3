package main

import (
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// sdNotify sends state to systemd's notification socket (Type=notify):
// "READY=1" once the node serves, "RELOADING=1" while SIGHUP is handled,
// "STOPPING=1" when it shuts down. Without $NOTIFY_SOCKET (not started by
// systemd) it does nothing. The protocol is one datagram on a unix
// socket: sd_notify(3).
func sdNotify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if strings.HasPrefix(path, "@") {
		path = "\x00" + path[1:] // abstract namespace
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	return nil
}

// reloading is the RELOADING=1 message: systemd (since 253) wants the
// CLOCK_MONOTONIC time of the reload's start with it.
func reloading() string {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return "RELOADING=1"
	}
	return fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d", ts.Nano()/int64(time.Microsecond))
}
