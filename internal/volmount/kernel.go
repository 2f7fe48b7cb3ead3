package volmount

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/replvol/replvol/transport/nbdclient"
)

// The kernel nbd driver's ioctls (linux/nbd.h: _IO(0xab, n)).
const (
	nbdSetSock       = 0xab00
	nbdSetBlksize    = 0xab01
	nbdDoIt          = 0xab03
	nbdClearSock     = 0xab04
	nbdClearQue      = 0xab05
	nbdSetSizeBlocks = 0xab07
	nbdDisconnect    = 0xab08
	nbdSetTimeout    = 0xab09
	nbdSetFlags      = 0xab0a
)

// ioctlStep is one ioctl on /dev/nbdN with an integer argument.
type ioctlStep struct {
	Name    string
	Request uint
	Arg     uint64
}

// kernelSteps are the ioctls that give /dev/nbdN the export ex over the connected sockets
// socks (one per NBD connection, negotiated up to the transmission phase), before NBD_DO_IT.
// The sockets come first: NBD_SET_SOCK claims the device (EBUSY when another client set it
// up), so nothing of a device in use is touched. Then the block size, the size in blocks, the
// transmission flags (the kernel sends flushes and FUA, trims and uses multi-conn as the
// server offers) and the request timeout.
func kernelSteps(ex nbdclient.Export, socks []int, timeout time.Duration) ([]ioctlStep, error) {
	if len(socks) == 0 {
		return nil, errors.New("no NBD connection to give the kernel")
	}
	bs := blockSize(ex)
	if ex.Size <= 0 || ex.Size%bs != 0 {
		return nil, fmt.Errorf("the export's size, %d bytes, is not a whole number of %d-byte blocks: the kernel's nbd driver cannot serve it", ex.Size, bs)
	}
	var steps []ioctlStep
	for _, s := range socks {
		steps = append(steps, ioctlStep{"NBD_SET_SOCK", nbdSetSock, uint64(s)})
	}
	steps = append(steps,
		ioctlStep{"NBD_SET_BLKSIZE", nbdSetBlksize, uint64(bs)},
		ioctlStep{"NBD_SET_SIZE_BLOCKS", nbdSetSizeBlocks, uint64(ex.Size / bs)},
		ioctlStep{"NBD_SET_FLAGS", nbdSetFlags, uint64(ex.Flags)},
	)
	if timeout > 0 {
		steps = append(steps, ioctlStep{"NBD_SET_TIMEOUT", nbdSetTimeout, uint64((timeout + time.Second - 1) / time.Second)})
	}
	return steps, nil
}

// blockSize is the logical block size to give the kernel: the server's preferred one when it
// is a power of two from 512 to 4096 bytes, else 4096 when the size allows it, else 512.
func blockSize(ex nbdclient.Export) int64 {
	if p := int64(ex.PreferredBlock); p >= 512 && p <= 4096 && p&(p-1) == 0 && ex.Size%p == 0 {
		return p
	}
	if ex.Size%4096 == 0 {
		return 4096
	}
	return 512
}

// chooseVia decides how to attach: want, or for ViaAuto the kernel's nbd driver when
// /dev/nbd* exists and FUSE otherwise.
func chooseVia(want Via, haveNBD, haveFUSE bool) (Via, error) {
	switch want {
	case ViaAuto, "":
		if haveNBD {
			return ViaKernel, nil
		}
		if haveFUSE {
			return ViaFUSE, nil
		}
		return "", errors.New("this host has neither /dev/nbd0 nor /dev/fuse: load the nbd kernel module (modprobe nbd) or the fuse one (modprobe fuse)")
	case ViaKernel:
		if !haveNBD {
			return "", errors.New("--via kernel: this host has no /dev/nbd0: load the nbd kernel module (modprobe nbd), or use --via fuse")
		}
		return ViaKernel, nil
	case ViaFUSE:
		if !haveFUSE {
			return "", errors.New("--via fuse: this host has no /dev/fuse: load the fuse kernel module (modprobe fuse), or use --via kernel")
		}
		return ViaFUSE, nil
	}
	return "", fmt.Errorf("--via %q: want auto, kernel or fuse", want)
}

// haveDevice reports whether a device node exists.
func haveDevice(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// freeNBDDevices lists the nbd devices no client holds, in number order, from sysfs's block
// directory (/sys/block): nbdN is held while nbdN/pid exists.
func freeNBDDevices(sysBlock fs.FS) ([]string, error) {
	entries, err := fs.ReadDir(sysBlock, ".")
	if err != nil {
		return nil, err
	}
	var nums []int
	for _, e := range entries {
		n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "nbd"))
		if !strings.HasPrefix(e.Name(), "nbd") || err != nil {
			continue
		}
		if _, err := fs.Stat(sysBlock, e.Name()+"/pid"); err == nil {
			continue
		}
		nums = append(nums, n)
	}
	sort.Ints(nums)
	out := make([]string, len(nums))
	for i, n := range nums {
		out[i] = fmt.Sprintf("/dev/nbd%d", n)
	}
	return out, nil
}

// nbdConnected reports whether a client holds /dev/nbdN.
func nbdConnected(dev string) bool {
	_, err := os.Stat("/sys/block/" + strings.TrimPrefix(dev, "/dev/") + "/pid")
	return err == nil
}
