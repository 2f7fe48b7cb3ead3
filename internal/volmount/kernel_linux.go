package volmount

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/replvol/replvol/transport/nbdclient"
)

// ioctl runs one ioctl with an integer argument.
func ioctl(f *os.File, req uint, arg uint64) error {
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(req), uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// serveKernel gives the export to the kernel's nbd driver as the first free /dev/nbdN and
// holds it (NBD_DO_IT) until a stop signal disconnects it. With TLS the kernel gets one end of
// a socket pair per connection, and this process relays it to the TLS connection (the
// kernel's driver speaks no TLS).
//
// Untested here: the machines this was written on have no nbd module.
func serveKernel(cfg HelperConfig, logger *log.Logger, tell func(ready), stop <-chan os.Signal) error {
	uri, err := nbdclient.ParseURI(cfg.URI)
	if err != nil {
		return err
	}
	uri = uri.Local()
	opts, err := tlsFor(uri, cfg.TLSDir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	n := max(1, min(cfg.Connections, nbdclient.MaxConnections))
	var (
		ex    nbdclient.Export
		socks []*os.File
		fds   []int
	)
	defer func() {
		for _, s := range socks {
			s.Close()
		}
	}()
	for i := 0; i < n; i++ {
		var d net.Dialer
		raw, err := d.DialContext(ctx, "tcp", uri.Addr)
		if err != nil {
			return fmt.Errorf("connect to %s: %w", uri, err)
		}
		conn, e, err := nbdclient.Negotiate(ctx, raw, uri.Export, opts.TLS)
		if err != nil {
			raw.Close()
			return fmt.Errorf("connect to %s: %w", uri, err)
		}
		if i == 0 {
			ex = e
			if ex.ReadOnly() {
				conn.Close()
				return fmt.Errorf("%s is read-only: the node serving it is not the volume's primary", uri)
			}
			if !ex.CanMultiConn() {
				n = 1
			}
		} else if e.Size != ex.Size || e.Flags != ex.Flags {
			conn.Close()
			return fmt.Errorf("connection %d to %s sees another export (%d bytes, flags %#x; the first: %d, %#x)", i+1, uri, e.Size, e.Flags, ex.Size, ex.Flags)
		}
		s, err := kernelSocket(conn)
		if err != nil {
			conn.Close()
			return err
		}
		socks = append(socks, s)
		fds = append(fds, int(s.Fd()))
	}
	steps, err := kernelSteps(ex, fds, cfg.IOTimeout)
	if err != nil {
		return err
	}
	dev, f, err := claimNBDDevice(steps)
	if err != nil {
		return err
	}
	defer f.Close()
	doIt := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		doIt <- ioctl(f, nbdDoIt, 0)
	}()
	// NBD_DO_IT starts the device, then blocks: ready once the kernel shows it running.
	for waited := time.Duration(0); !nbdConnected(dev); waited += 20 * time.Millisecond {
		select {
		case err := <-doIt:
			_ = ioctl(f, nbdClearSock, 0)
			return fmt.Errorf("%s: NBD_DO_IT: %v", dev, err)
		default:
		}
		if waited > 10*time.Second {
			_ = ioctl(f, nbdDisconnect, 0)
			<-doIt
			_ = ioctl(f, nbdClearSock, 0)
			return fmt.Errorf("%s did not start within 10 s of NBD_DO_IT", dev)
		}
		time.Sleep(20 * time.Millisecond)
	}
	logger.Printf("serving %s (%d bytes, %d NBD connections) as %s", cfg.URI, ex.Size, n, dev)
	tell(ready{Device: dev, Size: ex.Size, Connections: n})
	for {
		select {
		case err := <-doIt:
			_ = ioctl(f, nbdClearQue, 0)
			_ = ioctl(f, nbdClearSock, 0)
			if err != nil && !errors.Is(err, syscall.EPIPE) {
				return fmt.Errorf("%s: NBD_DO_IT: %w", dev, err)
			}
			return nil
		case sig := <-stop:
			logger.Printf("%s: disconnecting %s", sig, dev)
			if err := ioctl(f, nbdDisconnect, 0); err != nil {
				logger.Printf("%s: NBD_DISCONNECT: %v", dev, err)
			}
		}
	}
}

// claimNBDDevice runs steps on the first free /dev/nbdN that takes them: another client may
// take a device between the look and the ioctls, and its first NBD_SET_SOCK then fails with
// EBUSY, having changed nothing; the next device is tried.
func claimNBDDevice(steps []ioctlStep) (string, *os.File, error) {
	free, err := freeNBDDevices(os.DirFS("/sys/block"))
	if err != nil {
		return "", nil, fmt.Errorf("list the nbd devices: %w", err)
	}
	var last error
	for _, dev := range free {
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			last = err
			continue
		}
		done, err := runSteps(f, steps)
		if err == nil {
			return dev, f, nil
		}
		last = fmt.Errorf("%s: %w", dev, err)
		if done == 0 && errors.Is(err, syscall.EBUSY) {
			f.Close()
			continue
		}
		// The device is this process's now: let it go.
		_ = ioctl(f, nbdClearSock, 0)
		f.Close()
		return "", nil, last
	}
	if last == nil {
		last = errors.New("every /dev/nbdN is in use: load the module with more (modprobe nbd nbds_max=32)")
	}
	return "", nil, last
}

// runSteps runs steps in order and returns how many succeeded.
func runSteps(f *os.File, steps []ioctlStep) (int, error) {
	for i, s := range steps {
		if err := ioctl(f, s.Request, s.Arg); err != nil {
			return i, fmt.Errorf("%s: %w", s.Name, err)
		}
	}
	return len(steps), nil
}

// kernelSocket is the socket to give the kernel for conn, an NBD connection in the
// transmission phase: a plain TCP connection's own socket, or for any other connection (TLS)
// one end of a socket pair whose other end this process relays to conn.
func kernelSocket(conn net.Conn) (*os.File, error) {
	if tc, ok := conn.(*net.TCPConn); ok {
		f, err := tc.File()
		tc.Close()
		if err != nil {
			return nil, err
		}
		f.Fd() // blocking mode, as the kernel's driver expects
		return f, nil
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	kernelEnd := os.NewFile(uintptr(fds[0]), "nbd-kernel")
	relayEnd := os.NewFile(uintptr(fds[1]), "nbd-relay")
	local, err := net.FileConn(relayEnd)
	relayEnd.Close()
	if err != nil {
		kernelEnd.Close()
		return nil, err
	}
	go relay(local, conn)
	return kernelEnd, nil
}

// relay copies between a and b both ways until either side ends, then closes both.
func relay(a, b net.Conn) {
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			a.Close()
			b.Close()
		})
	}
	go func() {
		_, _ = io.Copy(a, b)
		closeBoth()
	}()
	_, _ = io.Copy(b, a)
	closeBoth()
}

// disconnectNBD tells the kernel to drop /dev/nbdN's connections (NBD_DISCONNECT, then
// NBD_CLEAR_SOCK), for a device whose helper is gone.
func disconnectNBD(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := ioctl(f, nbdDisconnect, 0); err != nil {
		return fmt.Errorf("%s: NBD_DISCONNECT: %w", dev, err)
	}
	return ioctl(f, nbdClearSock, 0)
}

// loopSetCapacity is LOOP_SET_CAPACITY (linux/loop.h): the loop device reads its backing
// file's size again.
const loopSetCapacity = 0x4C07

// growLoops makes every loop device over file read its size again (LOOP_SET_CAPACITY, as
// losetup --set-capacity does) and returns them. The loop devices are found in sysfs
// (/sys/block/loopN/loop/backing_file): the helper does not know which one Mount set up, and
// the ioctl does not wait on the helper's own FUSE requests (they are served meanwhile).
func growLoops(file string) ([]string, error) {
	return growLoopsIn("/sys/block", "/dev", file)
}

func growLoopsIn(sysBlock, dev, file string) ([]string, error) {
	want := map[string]bool{filepath.Clean(file): true}
	if real, err := filepath.EvalSymlinks(file); err == nil {
		want[real] = true
	}
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, err
	}
	var grown []string
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "loop", "backing_file"))
		if err != nil || !want[strings.TrimSpace(string(b))] {
			continue // not set up, or over another file
		}
		path := filepath.Join(dev, e.Name())
		f, err := os.OpenFile(path, os.O_RDONLY, 0)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := ioctl(f, loopSetCapacity, 0); err != nil {
			errs = append(errs, fmt.Errorf("LOOP_SET_CAPACITY on %s: %w", path, err))
		} else {
			grown = append(grown, path)
		}
		f.Close()
	}
	return grown, errors.Join(errs...)
}
