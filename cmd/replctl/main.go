package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"
)

const defaultAddr = "127.0.0.1:7800"

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "replctl:", err)
		os.Exit(1)
	}
}

type globals struct {
	addr    string
	timeout time.Duration
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "replctl",
		Short:         "Operate a replvol cluster",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	addr := os.Getenv("REPLCTL_ADDR")
	if addr == "" {
		addr = defaultAddr
	}
	root.PersistentFlags().StringVar(&g.addr, "addr", addr, "control API of any node (HOST:PORT; env REPLCTL_ADDR)")
	root.PersistentFlags().DurationVar(&g.timeout, "timeout", 60*time.Second, "how long to wait for the cluster")
	root.AddCommand(newStatus(g), newPrimary(g), newConnect(g, true), newConnect(g, false), newResync(g), newVerify(g), newPath(g), newNode(g), newAdjust(g), newCreateMD(), newDemo())
	return root
}

// dial returns a control client for the node at --addr.
func (g *globals) dial() (*transport.ControlClient, context.Context, context.CancelFunc, error) {
	c, err := transport.DialControl(g.addr)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	return c, ctx, func() { cancel(); c.Close() }, nil
}

// apiError turns a gRPC error into the node's own message.
func (g *globals) apiError(err error) error {
	st := status.Convert(err)
	if st.Code().String() == "Unavailable" {
		return fmt.Errorf("cannot reach a node at %s (%s): is replnode running there? set --addr or REPLCTL_ADDR", g.addr, st.Message())
	}
	return fmt.Errorf("%s", st.Message())
}
