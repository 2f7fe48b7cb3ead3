package cluster

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/logonce"
)

// hclogger makes raft's logs (hclog) records of the node's slog logger.
// It keeps no global state, so each Cluster logs to its own logger.
type hclogger struct {
	log  *slog.Logger
	name string
	args []any
}

var _ hclog.Logger = (*hclogger)(nil)

func newHclogger(l *slog.Logger, name string) *hclogger { return &hclogger{log: l, name: name} }

func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

// repeated are raft's messages for a peer it cannot reach, logged at
// ERROR on every retry (several a second for as long as the peer is
// down). Gossip reports the dead node once; these go to DEBUG. This only
// picks a log level: no decision depends on it.
var repeated = map[string]bool{
	"failed to heartbeat to":         true,
	"failed to appendEntries to":     true,
	"failed to make requestVote RPC": true,
	"failed to contact":              true,
}

// shuttingDown reports whether one of a record's arguments is an error of
// this node's own clean stop: raft's network transport answers a command
// that arrives while it closes with raft.ErrTransportShutdown, and logs
// that at ERROR ("failed to decode incoming command"), and a connection
// closed under a reader ends with net.ErrClosed. Neither is a fault, and a
// clean stop must log nothing at ERROR. Matched by value, never by text.
func shuttingDown(args []any) bool {
	for _, a := range args {
		if err, ok := a.(error); ok && (errors.Is(err, raft.ErrTransportShutdown) || errors.Is(err, net.ErrClosed)) {
			return true
		}
	}
	return false
}

func (h *hclogger) Log(level hclog.Level, msg string, args ...any) {
	if level > hclog.Debug && (repeated[msg] || shuttingDown(args)) {
		level = hclog.Debug
	}
	if level == hclog.Off || !h.log.Enabled(context.Background(), slogLevel(level)) {
		return
	}
	all := make([]any, 0, 2+len(h.args)+len(args))
	all = append(append(append(all, "module", h.name), h.args...), args...)
	h.log.Log(context.Background(), slogLevel(level), msg, all...)
}

func (h *hclogger) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogger) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogger) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogger) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogger) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hclogger) enabled(l hclog.Level) bool {
	return h.log.Enabled(context.Background(), slogLevel(l))
}

func (h *hclogger) IsTrace() bool { return h.enabled(hclog.Trace) }
func (h *hclogger) IsDebug() bool { return h.enabled(hclog.Debug) }
func (h *hclogger) IsInfo() bool  { return h.enabled(hclog.Info) }
func (h *hclogger) IsWarn() bool  { return h.enabled(hclog.Warn) }
func (h *hclogger) IsError() bool { return h.enabled(hclog.Error) }

func (h *hclogger) ImpliedArgs() []any { return h.args }

func (h *hclogger) With(args ...any) hclog.Logger {
	c := *h
	c.args = append(append([]any{}, h.args...), args...)
	return &c
}

func (h *hclogger) Name() string { return h.name }

func (h *hclogger) Named(name string) hclog.Logger {
	c := *h
	c.name = h.name + "." + name
	return &c
}

func (h *hclogger) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	return &c
}

// SetLevel does nothing: the slog handler decides.
func (h *hclogger) SetLevel(hclog.Level) {}

func (h *hclogger) GetLevel() hclog.Level {
	for _, l := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn} {
		if h.enabled(l) {
			return l
		}
	}
	return hclog.Error
}

func (h *hclogger) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(nil), "", 0)
}

// StandardWriter takes the lines of a standard logger, like memberlist's
// "[DEBUG] memberlist: …", and logs each at the level its prefix names. A
// warning or error that repeats one logged lately, from the same host, is
// logged at DEBUG: memberlist logs a message that does not decrypt (a node
// without the cluster's gossip key) at every packet, several a second.
// Only the level depends on the text; no decision does.
func (h *hclogger) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return stdWriter{h: h, once: logonce.New(refusalQuiet, maxRefusalsKept, nil)}
}

type stdWriter struct {
	h    *hclogger
	once *logonce.Set
}

// portless is line with the port of its "from=HOST:PORT" (memberlist's
// LogAddress) taken out: a peer's TCP connections come from a new port
// each.
func portless(line string) string {
	fields := strings.Fields(line)
	for i, f := range fields {
		if addr, ok := strings.CutPrefix(f, "from="); ok {
			if host, _, err := net.SplitHostPort(addr); err == nil {
				fields[i] = "from=" + host
			}
		}
	}
	return strings.Join(fields, " ")
}

func (w stdWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := hclog.Info
	for prefix, l := range map[string]hclog.Level{
		"[TRACE]": hclog.Trace, "[DEBUG]": hclog.Debug, "[INFO]": hclog.Info,
		"[WARN]": hclog.Warn, "[ERR]": hclog.Error, "[ERROR]": hclog.Error,
	} {
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			level, line = l, strings.TrimSpace(rest)
			break
		}
	}
	if level >= hclog.Warn && !w.once.First(portless(line)) {
		level = hclog.Debug
	}
	w.h.Log(level, line)
	return len(p), nil
}
