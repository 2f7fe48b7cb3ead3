package node

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/replvol/replvol/transport"
)

// Storage pools (config: a node's pools). A directory pool holds one
// sparse file per volume created at run time, <dir>/<volume>.img, of the
// volume's size plus its internal metadata. Its free space is what the
// file system has free, less what the pool's sparse files may still
// take: a volume placed here is promised its whole size, so placement
// never counts the same bytes twice. An LVM pool is accepted in the
// file and reported, and never chosen: this release does not run
// lvcreate.

// poolLVMUnavailable is the state of an lvm_vg pool.
const poolLVMUnavailable = "lvm not available: this release places volumes only in directory pools"

// imageSuffix names a volume's backing file in a directory pool.
const imageSuffix = ".img"

// poolImage is the backing file of volume in the directory dir.
func poolImage(dir, volume string) string { return filepath.Join(dir, volume+imageSuffix) }

// pools are this node's storage pools as its running config names them,
// each with its size and free space.
func (n *Node) pools() []transport.PoolStatus {
	self, _ := n.config().Node(n.name)
	out := make([]transport.PoolStatus, 0, len(self.Pools))
	for _, p := range self.Pools {
		ps := transport.PoolStatus{Node: n.name, Name: p.Name}
		switch {
		case p.LVMVG != "":
			ps.State = poolLVMUnavailable
		default:
			size, free, err := dirPoolSpace(p.Dir)
			if err != nil {
				ps.State = err.Error()
			}
			ps.Size, ps.Free = size, free
		}
		out = append(out, ps)
	}
	return out
}

// dirPoolSpace is the size of the file system of a directory pool, and
// its free space less what the pool's sparse files may still take.
func dirPoolSpace(dir string) (size, free uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, 0, fmt.Errorf("directory %s does not exist: the node makes it at start and on SIGHUP; check that its parent is writable", dir)
		}
		return 0, 0, fmt.Errorf("directory %s: %v", dir, err)
	}
	size = st.Blocks * uint64(st.Bsize)
	free = st.Bavail * uint64(st.Bsize)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return size, 0, fmt.Errorf("directory %s: %v", dir, err)
	}
	var promised uint64
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), imageSuffix) || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		sys, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		if apparent, taken := uint64(info.Size()), uint64(sys.Blocks)*512; apparent > taken {
			promised += apparent - taken
		}
	}
	if promised >= free {
		return size, 0, nil
	}
	return size, free - promised, nil
}

// makePoolDirs makes the directories of this node's pools that do not
// exist yet (at start and on SIGHUP), and logs the ones it cannot.
func (n *Node) makePoolDirs(cfg *Config) {
	self, _ := cfg.Node(n.name)
	for _, p := range self.Pools {
		if p.Dir == "" {
			continue
		}
		if err := os.MkdirAll(p.Dir, 0o750); err != nil {
			n.log.Error("storage pool: cannot make its directory", "pool", p.Name, "dir", p.Dir, "err", err)
		}
	}
}
