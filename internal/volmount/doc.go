// Package volmount puts a volume's NBD export on this host as a block device and mounts it, for
// replctl mount and umount: through the kernel's nbd driver when /dev/nbd* exists, otherwise
// as a file served through FUSE by a helper process and put on a loop device. It records what
// it set up under a run directory, so that Unmount undoes exactly that, in order, and finds
// nothing to do the second time; a step that fails says what is left (StepError). It may
// import transport/nbdclient, internal/pki and internal/lockorder, nothing of the node. Its
// functions are for one caller per mount point at a time (the record's creation is the lock).
//
// A volume is mounted at most once, on any host: Mount takes the volume's claim from its
// primary through a Claimer (replctl's control API client) BEFORE the helper connects, with
// the claim's ID saved in the record first, and confirms it BEFORE any file system is probed,
// made or mounted; another mount's claim refuses it, --force or not. The primary keeps the
// claim while the mount's NBD connections are open and its --io-timeout after; replctl umount
// gives it back after Unmount. A record whose helper is gone (it crashed) is a mount to make
// again: Mount undoes what is left of it and takes the claim again under the record's ID.
//
// With Follow (replctl mount --follow, FUSE only) the helper follows the primary: an
// nbdclient.Follower, whose Locator (replctl's PrimaryFinder) finds the new primary through
// the cluster's control addresses and takes the claim there under the same ID BEFORE the
// helper connects; the helper says which primary it serves from in the Following file.
// Attach (replctl attach) stops at the block device: no file system is probed or mounted.
//
// Its one mutex (internal/lockorder's), the following helper's record of the primaries its
// Locator found, is a leaf: nothing else is locked while it is held.
package volmount
