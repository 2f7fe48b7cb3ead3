package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/replvol/replvol/config"
)

// A node refuses a client without a certificate on its TCP control port;
// on the node's host its unix socket needs none. Its path is the node's
// state directory's control.sock, which replnode's command line
// (--state-dir), the cluster file (state_dir) or its default (state-NODE
// beside the file) chose: localControlSocket finds the process that
// listens at --addr on this host (from /proc) and the socket it made, as
// replnode chose its state directory, rather than guess.

// localControlSocket is the control.sock of the replnode listening at
// addr (HOST:PORT) on this host; "" when none is found (another host, or
// /proc does not say).
func localControlSocket(addr string) string {
	_, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return ""
	}
	listeners := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, inode := range tcpListeners(f, uint16(port)) {
			listeners[inode] = true
		}
	}
	if len(listeners) == 0 {
		return ""
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		pid := filepath.Join("/proc", p.Name())
		for _, in := range socketInodes(filepath.Join(pid, "fd")) {
			if listeners[in] {
				return controlSocketOf(pid)
			}
		}
	}
	return ""
}

// controlSocketOf is the control socket of the replnode whose /proc
// directory is pid, from its command line as replnode reads it: the
// --state-dir, else the file's state_dir for --node, else state-NODE
// beside the file; "" unless a socket is there.
func controlSocketOf(pid string) string {
	b, err := os.ReadFile(filepath.Join(pid, "cmdline"))
	if err != nil {
		return ""
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	flags := map[string]string{}
	for i := 1; i < len(args); i++ {
		name, value, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if !strings.HasPrefix(args[i], "-") {
			continue
		}
		if !hasValue && i+1 < len(args) {
			value = args[i+1]
		}
		flags[name] = value
	}
	cwd, _ := os.Readlink(filepath.Join(pid, "cwd"))
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(cwd, p)
	}
	dir := abs(flags["state-dir"])
	if cfgPath := abs(flags["config"]); dir == "" && cfgPath != "" {
		if cfg, err := config.LoadConfig(cfgPath); err == nil {
			if nc, ok := cfg.Node(flags["node"]); ok && nc.StateDir != "" {
				dir = abs(nc.StateDir)
			}
		}
		if dir == "" {
			dir = filepath.Join(filepath.Dir(cfgPath), "state-"+flags["node"])
		}
	}
	if dir == "" {
		return ""
	}
	path := filepath.Join(dir, "control.sock")
	if fi, err := os.Stat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		return ""
	}
	return path
}

// tcpListeners lists the inodes of the sockets in file (/proc/net/tcp or
// tcp6) that listen on port.
func tcpListeners(file string, port uint16) []string {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" { // 0A: LISTEN
			continue
		}
		_, hexPort, ok := strings.Cut(fields[1], ":")
		if p, err := strconv.ParseUint(hexPort, 16, 16); !ok || err != nil || uint16(p) != port {
			continue
		}
		out = append(out, fields[9])
	}
	return out
}

// socketInodes lists the inodes of the sockets among the file
// descriptors in dir (/proc/PID/fd); none when it cannot be read.
func socketInodes(dir string) []string {
	fds, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if inode, ok := strings.CutPrefix(target, "socket:["); err == nil && ok {
			out = append(out, strings.TrimSuffix(inode, "]"))
		}
	}
	return out
}

// unixSocketHint says how to reach the node at addr without a
// certificate: its unix socket, by its path when it runs on this host.
func unixSocketHint(addr string) string {
	if path := localControlSocket(addr); path != "" {
		return fmt.Sprintf("or, on this host, use its unix socket (--addr unix://%s)", path)
	}
	return "or, on the node's host, use its unix socket (--addr unix://STATE_DIR/control.sock: the node's state directory, which is its --state-dir, else state_dir in the cluster file; /var/lib/replvol under the systemd unit)"
}
