package node

import "github.com/replvol/replvol/backing"

// Disk is a node's backing store for one volume (backing.Disk).
type Disk = backing.Disk

// OpenDisk opens the backing file or device at path and checks that it
// holds at least size bytes (backing.OpenDisk).
func OpenDisk(path string, size int64) (Disk, error) { return backing.OpenDisk(path, size) }
