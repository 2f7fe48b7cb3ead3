package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// TestACleanStopLogsNoError: raft's transport, closing while a peer's
// command arrives, logs "failed to decode incoming command" with
// raft.ErrTransportShutdown at ERROR; a node's clean stop (SIGTERM) must
// log nothing at ERROR, so the adapter keeps it at DEBUG. The same record
// with any other error stays an ERROR.
func TestACleanStopLogsNoError(t *testing.T) {
	var buf bytes.Buffer
	h := newHclogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), "raft").Named("net")
	h.Error("failed to decode incoming command", "error", raft.ErrTransportShutdown)
	h.Error("failed to decode incoming command", "error", fmt.Errorf("read: %w", net.ErrClosed))
	if buf.Len() != 0 {
		t.Fatalf("a clean stop logged:\n%s", buf.String())
	}
	h.Error("failed to decode incoming command", "error", errors.New("msgpack decode error"))
	if out := buf.String(); !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "msgpack decode error") {
		t.Fatalf("a real decode failure is not an ERROR any more:\n%s", out)
	}
}
