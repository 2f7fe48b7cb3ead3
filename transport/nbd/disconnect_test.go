package nbd_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

// TestAClientThatHangsUpMidRequestChangesNothing: a client that goes away
// in the middle of a request (inside its header, inside a write's
// payload, or with a read in flight) costs the server its connection
// only: a request not received whole never reaches the Export, the
// connection is closed and counted, and the next client is served.
func TestAClientThatHangsUpMidRequestChangesNothing(t *testing.T) {
	header := func(typ uint16, off uint64, length uint32) []byte {
		b := binary.BigEndian.AppendUint32(nil, nbdtest.MagicRequest)
		b = binary.BigEndian.AppendUint16(b, 0)
		b = binary.BigEndian.AppendUint16(b, typ)
		b = binary.BigEndian.AppendUint64(b, 1)
		b = binary.BigEndian.AppendUint64(b, off)
		return binary.BigEndian.AppendUint32(b, length)
	}
	for _, tc := range []struct {
		name   string
		sent   []byte
		writes int64 // Export writes the request may make
	}{
		{"inside a request header", header(nbdtest.CmdWrite, 0, 8192)[:17], 0},
		{"inside a write's payload", append(header(nbdtest.CmdWrite, 0, 8192), bytes.Repeat([]byte{0xee}, 100)...), 0},
		{"with a read in flight", header(nbdtest.CmdRead, 0, 1<<20), 0},
		{"after a whole write", append(header(nbdtest.CmdWrite, 4096, 4), "abcd"...), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := nbdtest.NewMemExport(testExportSize)
			mem.Fill(0, 16, 0x5a)
			s := startServer(t, map[string]nbd.Export{"vol": mem})
			c := s.dial(t, "vol")
			if err := c.SendRaw(tc.sent); err != nil {
				t.Fatal(err)
			}
			c.Close()
			waitUntil(t, "the server closing the connection", func() (bool, string) {
				n := s.Stats().OpenConnections
				return n == 0, fmt.Sprint(n, " open")
			})
			if n := mem.Calls(nbdtest.OpWrite); n > tc.writes {
				t.Fatalf("%d writes reached the Export, want at most %d", n, tc.writes)
			}
			next := s.dial(t, "vol")
			got, err := next.Read(0, 16)
			if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, 16)) {
				t.Fatalf("the next client reads %q, %v", got, err)
			}
			if err := next.Write(8192, []byte("next"), 0); err != nil {
				t.Fatalf("the next client writes: %v", err)
			}
		})
	}
}
