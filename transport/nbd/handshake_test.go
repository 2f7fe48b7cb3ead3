package nbd_test

// These tests pin the fixed newstyle negotiation: which flags are offered and accepted, how each
// option is answered, that an option's result never leaks into the next, and that a client that
// will not finish negotiating is cut off.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

const allTransmissionFlags = nbdtest.FlagHasFlags | nbdtest.FlagSendFlush | nbdtest.FlagSendFUA |
	nbdtest.FlagSendTrim | nbdtest.FlagSendWriteZeroes | nbdtest.FlagCanMultiConn

func TestGoReportsExportAndRequestedInfo(t *testing.T) {
	mem := nbdtest.NewMemExport(testExportSize)
	mem.Desc = "replicated volume vol"
	s := startServer(t, map[string]nbd.Export{"vol": mem})
	h := s.greet(t, nbdtest.ClientFixedNewstyle|nbdtest.ClientNoZeroes)
	if want := uint16(nbdtest.HandshakeFixedNewstyle | nbdtest.HandshakeNoZeroes); h.HandshakeFlags != want {
		t.Errorf("handshake flags %#x, want %#x", h.HandshakeFlags, want)
	}
	c, info, err := h.Go("vol", nbdtest.InfoName, nbdtest.InfoDescription, nbdtest.InfoBlockSize)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != testExportSize || info.Flags != allTransmissionFlags {
		t.Errorf("size %d flags %#x, want %d %#x", info.Size, info.Flags, testExportSize, allTransmissionFlags)
	}
	if info.Name != "vol" || info.Description != "replicated volume vol" {
		t.Errorf("name %q description %q", info.Name, info.Description)
	}
	if !info.HasBlockSize || info.MinBlock != 1 || info.PreferredBlock != 4096 || info.MaxBlock != 32<<20 {
		t.Errorf("block sizes %+v", info)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("transmission after GO: %v", err)
	}
}

func TestInfoWithoutRequestsOmitsNameAndDescription(t *testing.T) {
	mem := nbdtest.NewMemExport(4096)
	mem.Desc = "should not be sent"
	s := startServer(t, map[string]nbd.Export{"vol": mem})
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	info, err := h.Info(nbdtest.OptInfo, "vol")
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "" || info.Description != "" || info.Size != 4096 {
		t.Errorf("info %+v", info)
	}
	// INFO does not enter transmission: another option is still answered.
	if _, err := h.List(); err != nil {
		t.Fatalf("LIST after INFO: %v", err)
	}
}

func TestClientFlags(t *testing.T) {
	for _, tc := range []struct {
		name   string
		flags  uint32
		accept bool
	}{
		{"fixed newstyle and no zeroes", nbdtest.ClientFixedNewstyle | nbdtest.ClientNoZeroes, true},
		{"no flags at all (old newstyle client)", 0, true},
		{"unknown flag bit 2", nbdtest.ClientFixedNewstyle | 1<<2, false},
		{"unknown high bit", 1 << 31, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, nil)
			h := s.greet(t, tc.flags)
			_, _, err := h.Go("vol")
			if tc.accept && err != nil {
				t.Fatalf("GO: %v", err)
			}
			if !tc.accept {
				wantClosed(t, err)
			}
		})
	}
}

func TestUnknownOptionsAreUnsupportedAndNegotiationGoesOn(t *testing.T) {
	s := startServer(t, nil)
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	for _, option := range []uint32{nbdtest.OptStartTLS, nbdtest.OptStructuredRepl, 4, 99, 1 << 30} {
		if err := h.SendOption(option, []byte("some option data")); err != nil {
			t.Fatal(err)
		}
		rep, err := h.ReadReply()
		if err != nil {
			t.Fatal(err)
		}
		if rep.Option != option || rep.Type != nbdtest.RepErrUnsup {
			t.Fatalf("option %d: reply %+v, want NBD_REP_ERR_UNSUP", option, rep)
		}
	}
	if _, _, err := h.Go("vol"); err != nil {
		t.Fatalf("GO after unsupported options: %v", err)
	}
}

func TestUnknownExportErrorCarriesResolverMessage(t *testing.T) {
	s := startServer(t, nil)
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	for _, option := range []uint32{nbdtest.OptInfo, nbdtest.OptGo} {
		_, err := h.Info(option, "vol7")
		var oe *nbdtest.OptionError
		if !errors.As(err, &oe) || oe.Type != nbdtest.RepErrUnknown || oe.Message != refusal("vol7").Error() {
			t.Fatalf("option %d for unknown export: %v, want NBD_REP_ERR_UNKNOWN %q", option, err, refusal("vol7"))
		}
	}
}

func TestSelectedExportDoesNotLeakBetweenOptions(t *testing.T) {
	s := startServer(t, nil)
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	if _, err := h.Info(nbdtest.OptInfo, "vol"); err != nil {
		t.Fatal(err)
	}
	// A GO for an unknown name after a successful INFO must not enter transmission on "vol".
	var oe *nbdtest.OptionError
	if _, _, err := h.Go("missing"); !errors.As(err, &oe) || oe.Type != nbdtest.RepErrUnknown {
		t.Fatalf("GO missing after INFO vol: %v, want NBD_REP_ERR_UNKNOWN", err)
	}
	c, info, err := h.Go("vol")
	if err != nil || info.Size != testExportSize {
		t.Fatalf("GO vol: %v %+v", err, info)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestMalformedAndOversizedOptionsAreErrorsNotDisconnects(t *testing.T) {
	s := startServer(t, nil)
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	bad := map[string]struct {
		option uint32
		data   []byte
		want   uint32
	}{
		"GO shorter than its header":            {nbdtest.OptGo, []byte{0, 0}, nbdtest.RepErrInvalid},
		"GO name length past the end":           {nbdtest.OptGo, []byte{0, 0, 1, 0, 'v', 0, 0}, nbdtest.RepErrInvalid},
		"INFO with trailing bytes":              {nbdtest.OptInfo, append(nbdtest.InfoPayload("vol"), 9), nbdtest.RepErrInvalid},
		"INFO info count larger than data":      {nbdtest.OptInfo, append(nbdtest.InfoPayload("vol")[:7:7], 0, 2), nbdtest.RepErrInvalid},
		"LIST with data":                        {nbdtest.OptList, []byte("x"), nbdtest.RepErrInvalid},
		"option data over the server's limit":   {nbdtest.OptGo, make([]byte, 1<<20), nbdtest.RepErrTooBig},
		"name over 4096 bytes in the INFO data": {nbdtest.OptInfo, nbdtest.InfoPayload(string(make([]byte, 5000))), nbdtest.RepErrInvalid},
	}
	for name, tc := range bad {
		if err := h.SendOption(tc.option, tc.data); err != nil {
			t.Fatal(err)
		}
		rep, err := h.ReadReply()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if rep.Option != tc.option || rep.Type != tc.want {
			t.Errorf("%s: reply %+v, want type %#x", name, rep, tc.want)
		}
	}
	if _, _, err := h.Go("vol"); err != nil {
		t.Fatalf("GO after bad options: %v", err)
	}
}

func TestListNamesEveryExport(t *testing.T) {
	s := startServer(t, map[string]nbd.Export{"a": nbdtest.NewMemExport(512), "b": nbdtest.NewMemExport(512)})
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	names, err := h.List()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"a", "b"}) {
		t.Fatalf("LIST: %q", names)
	}
}

func TestAbortIsAcknowledgedThenClosed(t *testing.T) {
	s := startServer(t, nil)
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	if err := h.SendOption(nbdtest.OptAbort, nil); err != nil {
		t.Fatal(err)
	}
	rep, err := h.ReadReply()
	if err != nil || rep.Type != nbdtest.RepAck {
		t.Fatalf("ABORT reply %+v %v", rep, err)
	}
	if _, err := h.ReadReply(); !errors.Is(err, io.EOF) {
		t.Fatalf("after ABORT: %v, want EOF", err)
	}
}

func TestExportNameOption(t *testing.T) {
	for _, tc := range []struct {
		name        string
		clientFlags uint32
	}{
		{"with NO_ZEROES (10 bytes)", nbdtest.ClientFixedNewstyle | nbdtest.ClientNoZeroes},
		{"without NO_ZEROES (134 bytes)", nbdtest.ClientFixedNewstyle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, nil)
			h := s.greet(t, tc.clientFlags)
			c, info, err := h.ExportName("vol")
			if err != nil {
				t.Fatal(err)
			}
			if info.Size != testExportSize || info.Flags != allTransmissionFlags {
				t.Fatalf("info %+v", info)
			}
			// If the reply had the wrong length, this request/reply pair would be misparsed.
			if err := c.Write(0, []byte("abc"), 0); err != nil {
				t.Fatal(err)
			}
			if got, err := c.Read(0, 3); err != nil || string(got) != "abc" {
				t.Fatalf("read %q %v", got, err)
			}
		})
	}
	t.Run("unknown export closes without a reply", func(t *testing.T) {
		s := startServer(t, nil)
		h := s.greet(t, nbdtest.ClientFixedNewstyle)
		if err := h.SendOption(nbdtest.OptExportName, []byte("missing")); err != nil {
			t.Fatal(err)
		}
		if n, err := h.Conn.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
			t.Fatalf("read %d bytes, %v; want EOF", n, err)
		}
	})
}

func TestHandshakeDeadlineClosesIdleClients(t *testing.T) {
	s := startServer(t, nil, func(c *nbd.Config) { c.HandshakeTimeout = 50 * time.Millisecond })
	conn, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	setTestDeadline(t, conn)
	// Read the greeting, then say nothing: the server must hang up on its own.
	greeting, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("read until close: %v", err)
	}
	if len(greeting) != 18 || !bytes.Equal(greeting[:8], []byte("NBDMAGIC")) {
		t.Fatalf("greeting %q", greeting)
	}
	// A client that negotiates in time keeps its connection past the handshake deadline:
	// transmission has no deadline.
	c := s.dial(t, "vol")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	<-ctx.Done() // outlive the 50 ms handshake deadline (waiting on time is the point here)
	cancel()
	if err := c.Flush(); err != nil {
		t.Fatalf("flush after the handshake deadline passed: %v", err)
	}
	if got := s.Stats().FailedHandshakes; got != 1 {
		t.Errorf("FailedHandshakes %d, want 1", got)
	}
}

func TestShutdownClosesNegotiatingConnections(t *testing.T) {
	s := startServer(t, nil)
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// The negotiating connection was closed; the client's next option sees EOF (or a reset).
	_, _, err := h.Go("vol")
	wantClosed(t, err)
}

func TestOptionHeaderWithBadMagicCloses(t *testing.T) {
	s := startServer(t, nil)
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	b := binary.BigEndian.AppendUint64(nil, 0x1234)
	b = binary.BigEndian.AppendUint64(b, nbdtest.OptList)
	if _, err := h.Conn.Write(b); err != nil {
		t.Fatal(err)
	}
	_, err := h.ReadReply()
	wantClosed(t, err)
}
