// Package volmount puts a volume's NBD export on this host as a block device and mounts it, for
// replctl mount and umount: through the kernel's nbd driver when /dev/nbd* exists, otherwise
// as a file served through FUSE by a helper process and put on a loop device. It records what
// it set up under a run directory, so that Unmount undoes exactly that, in order, and finds
// nothing to do the second time. It may import transport/nbdclient and internal/pki, nothing
// of the node. Its functions are for one caller per mount point at a time (the record's
// creation is the lock).
package volmount
