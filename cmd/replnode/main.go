package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/replvol/replvol/node"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are replnode's command line (its man page,
// deploy/man/replnode.8, describes every flag: TestTheManPageDescribesEveryFlag).
type options struct {
	configPath, name, stateDir, logLevel *string
	join, showVersion                    *bool
}

func newFlags() (*flag.FlagSet, options) {
	fs := flag.NewFlagSet("replnode", flag.ContinueOnError)
	return fs, options{
		configPath:  fs.String("config", "", "cluster config file (YAML); SIGHUP re-reads it"),
		name:        fs.String("node", "", "this node's name in the config"),
		stateDir:    fs.String("state-dir", "", "directory for the node's state (default: nodes[].state_dir, else state-NODE next to the config)"),
		logLevel:    fs.String("log-level", "info", "debug, info, warn or error"),
		join:        fs.Bool("join", false, "this node was added to a running cluster (replctl node add): do not bootstrap raft, wait for the leader"),
		showVersion: fs.Bool("version", false, "print the version and exit"),
	}
}

// run is replnode with args; it prints to out and says what went wrong
// on errOut, and returns the exit status.
func run(args []string, out, errOut io.Writer) int {
	fs, o := newFlags()
	fs.SetOutput(errOut)
	configPath, name, stateDir, logLevel, join, showVersion := o.configPath, o.name, o.stateDir, o.logLevel, o.join, o.showVersion
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showVersion {
		fmt.Fprintln(out, "replnode "+versionString())
		return 0
	}
	if *configPath == "" || *name == "" {
		fmt.Fprintln(errOut, "replnode: --config FILE and --node NAME are required")
		fs.Usage()
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(errOut, "replnode: --log-level %q: want debug, info, warn or error\n", *logLevel)
		return 2
	}
	log := slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: level}))

	// Every problem of the file, and of the files it names for this node
	// (its certificates), in one report.
	cfg, err := node.LoadNodeConfig(*configPath, *name)
	if err != nil {
		fmt.Fprintf(errOut, "replnode: %v\n", err)
		return 1
	}
	dir := *stateDir
	if nc, ok := cfg.Node(*name); ok && dir == "" && nc.StateDir == "" {
		dir = filepath.Join(filepath.Dir(*configPath), "state-"+*name)
	}
	// The node may keep what it was given: the reloader compares the file
	// with a config of its own.
	running, err := node.LoadConfig(*configPath)
	if err != nil {
		fmt.Fprintf(errOut, "replnode: %v\n", err)
		return 1
	}
	// Signals are caught from here on: a SIGHUP during the start waits,
	// and a SIGTERM stops the node once started.
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	n, err := node.New(cfg, *name, node.Options{StateDir: dir, Logger: log, Join: *join, Version: release()})
	if err != nil {
		fmt.Fprintf(errOut, "replnode: %v\n", err)
		return 1
	}
	if err := n.Start(); err != nil {
		fmt.Fprintf(errOut, "replnode: %v\n", err)
		n.Close()
		return 1
	}
	if err := sdNotify("READY=1\nSTATUS=serving, control API on " + n.ControlAddr()); err != nil {
		log.Warn("systemd notification", "err", err)
	}
	r := &reloader{path: *configPath, name: *name, control: n.ControlSocket(), log: log, running: running, volumes: n, report: n}
	for s := range sig {
		if s != syscall.SIGHUP {
			break
		}
		notify(log, reloading())
		r.reload(context.Background())
		notify(log, "READY=1")
	}
	log.Info("stopping")
	notify(log, "STOPPING=1")
	if err := n.Close(); err != nil {
		fmt.Fprintf(errOut, "replnode: stop: %v\n", err)
		return 1
	}
	return 0
}

func notify(log *slog.Logger, state string) {
	if err := sdNotify(state); err != nil {
		log.Warn("systemd notification", "err", err)
	}
}
