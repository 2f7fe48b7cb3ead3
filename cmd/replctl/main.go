package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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
	os.Exit(run(ctx, newRoot(), os.Stderr))
}

// run executes the command line and returns the exit status (see
// exitCode), having said what went wrong on errOut.
func run(ctx context.Context, root *cobra.Command, errOut io.Writer) int {
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	code := exitCode(err)
	fmt.Fprintln(errOut, "replctl:", err)
	if code == exitUsage && cmd != nil {
		fmt.Fprintf(errOut, "see %s --help\n", cmd.CommandPath())
	}
	return code
}

type globals struct {
	addr    string
	timeout time.Duration
	color   string
	// tlsDir holds the cluster's CA and the operator's certificate and
	// key (--tls-dir); bundle is what was read there.
	tlsDir string
	bundle *pki.Bundle
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "replctl",
		Short:         "Operate a replvol cluster",
		Long:          "Operate a replvol cluster.\n\n" + exitCodesHelp,
		Version:       versionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("replctl {{.Version}}\n")
	addr := os.Getenv("REPLCTL_ADDR")
	if addr == "" {
		addr = defaultAddr
	}
	root.PersistentFlags().StringVar(&g.addr, "addr", addr, "control API of any node (HOST:PORT, or on a node's host its unix socket unix:///STATE_DIR/control.sock; env REPLCTL_ADDR)")
	root.PersistentFlags().StringVar(&g.tlsDir, "tls-dir", os.Getenv("REPLCTL_TLS_DIR"), "directory with the cluster's ca.crt and the operator's operator.crt and operator.key, as replctl certs init writes them, for a cluster with a tls: section (env REPLCTL_TLS_DIR; a unix socket needs none)")
	root.PersistentFlags().DurationVar(&g.timeout, "timeout", 60*time.Second, "how long to wait for the cluster")
	root.PersistentFlags().StringVar(&g.color, "color", "auto", "colours: auto (on a terminal, unless NO_COLOR is set), always or never")
	root.AddCommand(newStatus(g), newEvents(g), newPrimary(g), newConnect(g, true), newConnect(g, false), newResync(g), newVerify(g), newScrub(g), newPath(g), newNode(g), newAdjust(g), newMount(g), newUmount(), newAttach(g), newDetach(), newMountHelper(), newCreateMD(), newCerts(), newDemo(), newMan())
	root.AddCommand(newResize(g), newVolume(g), newVersion())
	markUsageErrors(root)
	registerCompletions(root, g)
	return root
}

// markUsageErrors makes cobra's own errors (an unknown command or flag, a
// wrong number of arguments) usage errors, exit code 2. A command that
// only groups others prints its help, and names an unknown subcommand.
func markUsageErrors(root *cobra.Command) {
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return asUsage(suggestFlag(c, err)) })
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		switch {
		case c.Args != nil:
			args := c.Args
			c.Args = func(c *cobra.Command, a []string) error { return asUsage(args(c, a)) }
		case c.HasSubCommands() && c.Run == nil && c.RunE == nil:
			c.Args = unknownSubcommand
			c.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// unknownSubcommand refuses an argument of a command that only groups
// others, suggesting the nearest subcommand.
func unknownSubcommand(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
	if c.SuggestionsMinimumDistance <= 0 {
		c.SuggestionsMinimumDistance = 2 // cobra's default for its own message
	}
	if s := c.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
	}
	return usageErrorf("%s", msg)
}

// suggestFlag adds to an unknown long flag the nearest flags command c
// has (its own and those it inherits): --wtach, did you mean --watch?
func suggestFlag(c *cobra.Command, err error) error {
	var ne *pflag.NotExistError
	if !errors.As(err, &ne) || ne.GetSpecifiedShortnames() != "" {
		return err
	}
	typed := ne.GetSpecifiedName()
	best, near := 0, []string(nil)
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := editDistance(typed, f.Name)
		if strings.HasPrefix(f.Name, typed) && len(typed) >= 2 {
			d = 1 // --wat for --watch
		}
		switch {
		case d > 2 || d > len(typed)/2:
		case near == nil || d < best:
			best, near = d, []string{"--" + f.Name}
		case d == best:
			near = append(near, "--"+f.Name)
		}
	})
	if len(near) == 0 {
		return err
	}
	sort.Strings(near)
	return fmt.Errorf("%w (did you mean %s?)", err, strings.Join(near, " or "))
}

// editDistance is the Levenshtein distance of a and b, a swap of two
// neighbours counting one (Damerau's optimal string alignment): wtach is
// one from watch.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
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
	c, err := g.dialControl(g.addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	return &call{g: g, c: c, ctx: ctx, cancel: cancel, parent: cmd.Context(), action: action}, nil
}

// dialControl returns a client of the node at addr, with the operator's
// certificate from --tls-dir when it is set (a unix socket needs none).
func (g *globals) dialControl(addr string) (*transport.ControlClient, error) {
	var opts []transport.DialOption
	if _, unix := transport.UnixPath(addr); !unix && g.tlsDir != "" {
		if g.bundle == nil {
			dir := g.tlsDir
			b, err := pki.Load(filepath.Join(dir, pki.CAFile), filepath.Join(dir, pki.CertFile("operator")), filepath.Join(dir, pki.KeyFile("operator")))
			if err != nil {
				return nil, usageErrorf("--tls-dir %s: %v: point --tls-dir (or REPLCTL_TLS_DIR) at the directory replctl certs init wrote, with ca.crt, operator.crt and operator.key", dir, err)
			}
			g.bundle = b
		}
		// Any node of the cluster's CA may answer at --addr.
		opts = append(opts, transport.WithTLS(g.bundle.ClientConfig(addr, pki.Roles(pki.RoleNode))))
	}
	c, err := transport.DialControl(addr, opts...)
	if err != nil {
		return nil, usageErrorf("cannot use --addr %q: %v", addr, err)
	}
	return c, nil
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
