package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
)

const defaultAddr = "127.0.0.1:7800"

func main() {
	// The first Ctrl-C (or SIGTERM) cancels the command's context, so a
	// stream or a watch ends cleanly and a request in flight says it was
	// interrupted; a second one kills the process as usual.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "replctl:", err)
		// An error with its own code (status --check's verdict) exits
		// with it; every other one with 1.
		code := 1
		var coded interface{ ExitCode() int }
		if errors.As(err, &coded) {
			code = coded.ExitCode()
		}
		os.Exit(code)
	}
}

type globals struct {
	addr    string
	timeout time.Duration
	color   string
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "replctl",
		Short:         "Operate a replvol cluster",
		Version:       versionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("replctl {{.Version}}\n")
	addr := os.Getenv("REPLCTL_ADDR")
	if addr == "" {
		addr = defaultAddr
	}
	root.PersistentFlags().StringVar(&g.addr, "addr", addr, "control API of any node (HOST:PORT; env REPLCTL_ADDR)")
	root.PersistentFlags().DurationVar(&g.timeout, "timeout", 60*time.Second, "how long to wait for the cluster")
	root.PersistentFlags().StringVar(&g.color, "color", "auto", "colours: auto (on a terminal, unless NO_COLOR is set), always or never")
	root.AddCommand(newStatus(g), newEvents(g), newPrimary(g), newConnect(g, true), newConnect(g, false), newResync(g), newVerify(g), newPath(g), newNode(g), newAdjust(g), newCreateMD(), newDemo())
	return root
}

// call is one command's conversation with the node at --addr: the client,
// the command's context (cancelled by Ctrl-C and --timeout) and what the
// command does, to say in words what a failure means.
type call struct {
	g      *globals
	c      *transport.ControlClient
	ctx    context.Context
	cancel context.CancelFunc
	// parent is the command's context, without --timeout.
	parent context.Context
	// action names what the command changes ("the switchover"); empty
	// for commands that only read.
	action string
}

// dial returns a call to the node at --addr, bounded by --timeout.
func (g *globals) dial(cmd *cobra.Command, action string) (*call, error) {
	c, err := transport.DialControl(g.addr)
	if err != nil {
		return nil, fmt.Errorf("cannot use --addr %q: %v", g.addr, err)
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	return &call{g: g, c: c, ctx: ctx, cancel: cancel, parent: cmd.Context(), action: action}, nil
}

// close releases the call's connection.
func (k *call) close() {
	k.cancel()
	k.c.Close()
}

// status fetches the cluster status and remembers its nodes' addresses,
// so that a later failure can name the node at an address.
func (k *call) status() (*transport.ClusterStatus, error) {
	st, err := k.c.ClusterStatus(k.ctx, &transport.StatusRequest{})
	if err != nil {
		return nil, err
	}
	rememberNodes(st)
	return st, nil
}
