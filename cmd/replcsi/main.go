package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/replvol/replvol/internal/buildinfo"
	"github.com/replvol/replvol/internal/csidriver"
	"github.com/replvol/replvol/internal/volmount"
)

// version is set by go build -ldflags "-X main.version=..." for a build outside a checkout.
var version string

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is replcsi with args; it serves until SIGTERM or SIGINT and returns the exit status.
func run(args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("replcsi", flag.ContinueOnError)
	fs.SetOutput(errOut)
	var (
		endpoint = fs.String("endpoint", "unix:///csi/csi.sock", "where to serve CSI: unix:///PATH or tcp://HOST:PORT")
		nodeID   = fs.String("node-id", "", "this host's node name, as Kubernetes knows it (NodeGetInfo)")
		addr     = fs.String("addr", "", "a replnode's control address: HOST:PORT, or unix:///var/lib/replvol/control.sock")
		tlsDir   = fs.String("tls-dir", "", "the directory replctl certs init wrote (ca.crt, operator.crt, operator.key, nbd-client/), for a cluster with a tls: section")
		replctl  = fs.String("replctl", "", "the replctl binary that attaches volumes (default: replctl next to replcsi, else on $PATH)")
		runDir   = fs.String("run-dir", volmount.DefaultRunDir, "replctl's run directory: the records of the volumes attached on this host")
		ioTime   = fs.Duration("io-timeout", time.Minute, "how long an attached volume waits for a primary before its requests fail")
		showVer  = fs.Bool("version", false, "print the version and exit")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showVer {
		fmt.Fprintln(out, "replcsi "+buildinfo.String(version))
		return 0
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(errOut, "replcsi: unexpected argument %q: every setting is a flag\n", fs.Arg(0))
		return 2
	}
	if *ioTime <= 0 {
		fmt.Fprintf(errOut, "replcsi: --io-timeout %s: give a positive duration\n", *ioTime)
		return 2
	}
	log := slog.New(slog.NewTextHandler(errOut, nil))
	bin, err := findReplctl(*replctl)
	if err != nil {
		fmt.Fprintf(errOut, "replcsi: %v\n", err)
		return 2
	}
	d, err := csidriver.New(csidriver.Config{
		NodeID: *nodeID, Addr: *addr, TLSDir: *tlsDir, Replctl: bin, RunDir: *runDir, IOTimeout: *ioTime,
		Version: buildinfo.Read(version).Release,
		Logf:    func(format string, args ...any) { log.Info(fmt.Sprintf(format, args...)) },
	})
	if err != nil {
		fmt.Fprintf(errOut, "replcsi: %v\n", err)
		return 2
	}
	defer d.Close()
	lis, err := csidriver.Listen(*endpoint)
	if err != nil {
		fmt.Fprintf(errOut, "replcsi: %v\n", err)
		return 1
	}
	srv := d.Server()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	log.Info("replcsi serving", "endpoint", *endpoint, "node", *nodeID, "addr", *addr, "replctl", bin)
	if err := srv.Serve(lis); err != nil {
		fmt.Fprintf(errOut, "replcsi: %v\n", err)
		return 1
	}
	return 0
}

// findReplctl is the replctl to run: the one given, else replctl next to replcsi's own
// executable, else the one on $PATH.
func findReplctl(given string) (string, error) {
	if given != "" {
		if _, err := os.Stat(given); err != nil {
			return "", fmt.Errorf("--replctl %s: %w", given, err)
		}
		return filepath.Abs(given)
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "replctl")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("replctl")
	if err != nil {
		return "", errors.New("no replctl next to replcsi or on $PATH: install it, or give --replctl PATH")
	}
	return p, nil
}
