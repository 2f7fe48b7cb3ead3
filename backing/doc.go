// Package backing is a node's backing device of a volume: opening it (a
// file or block device, OpenDisk, or a multipath device over several
// labelled paths, Open), what its metadata takes of it (RequiredSize,
// UsableSize), and creating that metadata offline (CreateMetadata, for
// replctl create-md). It imports config, metadata, metadata/statefile
// (the state.db that create-md resets, hence bbolt) and multipath,
// never node, raft or memberlist. node and replctl call it; a Disk allows
// concurrent calls. It reads no time itself: a multipath device keeps the
// clock Open is given (OpenOptions.Clock, the node's).
//
// Its one mutex, a Disk's wmu (chunked writes land whole), is held while
// the file is written; nothing of the project is locked under it.
package backing
