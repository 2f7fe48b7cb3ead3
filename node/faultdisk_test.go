package node

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/replvol/replvol/internal/fault"
)

// openFaulty is an OpenDisk that wraps every disk it opens in a
// fault.Disk and hands it to opened (which may add rules) before the node
// uses it.
func openFaulty(opened func(*fault.Disk)) func(path string, size int64) (Disk, error) {
	return func(path string, size int64) (Disk, error) {
		d, err := OpenDisk(path, size)
		if err != nil {
			return nil, err
		}
		fd := fault.NewDisk(d)
		if opened != nil {
			opened(fd)
		}
		return fd, nil
	}
}

// faultDisk is the fault.Disk under a node's volume.
func (c *testCluster) faultDisk(name string) *fault.Disk {
	c.t.Helper()
	fd, ok := c.vol(name).disk.(*fault.Disk)
	if !ok {
		c.t.Fatalf("%s's disk is a %T, not a fault.Disk", name, c.vol(name).disk)
	}
	return fd
}

var errInjectedDisk = errors.New("injected disk error")

// failReadsAndWrites fails every read and write of d from now on.
func failReadsAndWrites(d *fault.Disk) { d.Add(fault.On(fault.Read, fault.Write).Err(errInjectedDisk)) }

// loseUnsynced is a power loss of a closed disk: what d's Lose'd writes
// overwrote since the last sync goes back into the file at path. It
// returns how many sectors went back.
func loseUnsynced(t *testing.T, d *fault.Disk, path string) int {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := d.LoseUnsynced(f)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// opRecorder records the order of writes and syncs on a disk:
// "write@OFF", "fua@OFF", "sync".
type opRecorder struct {
	mu  sync.Mutex
	ops []string
}

// Inject implements fault.Injector: it records and injects nothing.
func (r *opRecorder) Inject(op fault.Op) fault.Fault {
	var s string
	switch {
	case op.Kind == fault.Sync:
		s = "sync"
	case op.Kind == fault.Write && op.FUA:
		s = fmt.Sprintf("fua@%d", op.Off)
	case op.Kind == fault.Write:
		s = fmt.Sprintf("write@%d", op.Off)
	default:
		return fault.Fault{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, s)
	return fault.Fault{}
}

func (r *opRecorder) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ops) == 0 {
		return ""
	}
	return r.ops[len(r.ops)-1]
}
