package nbd

import "time"

// SetDrainTiming shortens how s's connections wind down (see drainQuiet) for the connections
// accepted after it; readerStopped, if not nil, is called when a draining connection's reader
// has stopped reading requests.
func SetDrainTiming(s *Server, quiet, limit, linger time.Duration, readerStopped func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drainTiming = drainTiming{quiet: quiet, limit: limit, linger: linger, readerStopped: readerStopped}
}
