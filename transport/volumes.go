package transport

import (
	"context"
	"crypto/rand"
	"encoding/hex"
)

// Methods of the control API that create, delete and list volumes made
// at run time from storage pools (replctl volume, the CSI driver). A
// volume made so is recorded in raft; any node forwards these calls to
// the raft leader, which places the replicas.
const (
	MethodVolumeCreate = "VolumeCreate"
	MethodVolumeDelete = "VolumeDelete"
	MethodVolumeList   = "VolumeList"
	MethodPools        = "Pools"
)

// Sources of a VolumeInfo.
const (
	// VolumeFromAPI: made by VolumeCreate and recorded in raft.
	VolumeFromAPI = "api"
	// VolumeFromConfig: defined in the cluster file.
	VolumeFromConfig = "config"
)

// VolumeCreateRequest asks for a volume of Size bytes with Replicas
// copies (0: 2) in the pool named Pool ("": "default"), replicated with
// Protocol ("": "C"). A create of a name that exists with the same
// definition succeeds and changes nothing (Created false); with another
// definition it is refused with codes.AlreadyExists. No pool with room:
// codes.ResourceExhausted, naming the free space per node; too few nodes
// for Replicas: codes.FailedPrecondition; bad input: codes.InvalidArgument.
type VolumeCreateRequest struct {
	Name     string `json:"name"`
	Size     uint64 `json:"size"`
	Replicas int    `json:"replicas,omitempty"`
	Pool     string `json:"pool,omitempty"`
	Protocol string `json:"protocol,omitempty"`
	// RequestID, chosen by the caller once per create (NewRequestID) and
	// sent again with every retry of it, is recorded with the volume: a
	// create whose answer a raft leader change cut off, asked again of
	// the next leader, finds its own record by it and answers Created
	// true, as the first would have. "" (a caller of an older version):
	// a create that finds the volume answers Created false.
	RequestID string `json:"request_id,omitempty"`
}

// NewRequestID is a VolumeCreateRequest.RequestID: 128 random bits, in
// hex.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand does not fail
	return hex.EncodeToString(b[:])
}

// VolumeCreateReply is the volume as recorded.
type VolumeCreateReply struct {
	Volume VolumeInfo `json:"volume"`
	// Created is false when an identical volume of that name existed.
	Created bool `json:"created"`
}

// VolumeDeleteRequest stops a volume made by VolumeCreate on every node
// and frees its storage. A name that does not exist is not an error
// (Deleted false); a volume of the cluster file, or one whose mount claim
// is held, is refused with codes.FailedPrecondition.
type VolumeDeleteRequest struct {
	Name string `json:"name"`
}

// VolumeDeleteReply says whether a volume was deleted.
type VolumeDeleteReply struct {
	Deleted bool `json:"deleted"`
}

// VolumeListRequest lists every volume, of the cluster file and of raft.
type VolumeListRequest struct{}

// VolumeListReply lists volumes by name.
type VolumeListReply struct {
	Volumes []VolumeInfo `json:"volumes"`
}

// VolumeInfo is one volume's definition and where it lives.
type VolumeInfo struct {
	Name     string `json:"name"`
	Size     uint64 `json:"size"`
	Pool     string `json:"pool,omitempty"`
	Protocol string `json:"protocol"`
	// Replicas are the nodes that hold a copy, the first one chosen
	// primary at creation.
	Replicas []string `json:"replicas"`
	// Source is VolumeFromAPI or VolumeFromConfig.
	Source string `json:"source"`
	// Primary is the node serving it now ("": none).
	Primary string `json:"primary,omitempty"`
}

// PoolsRequest asks for every node's storage pools (Node "": every
// node's; a node's name: that node's alone).
type PoolsRequest struct {
	Node string `json:"node,omitempty"`
}

// PoolsReply lists the pools of every node that answered.
type PoolsReply struct {
	Pools []PoolStatus `json:"pools"`
}

// PoolStatus is one pool on one node.
type PoolStatus struct {
	Node string `json:"node"`
	Name string `json:"name"`
	Size uint64 `json:"size"`
	Free uint64 `json:"free"`
	// State says why the pool takes no volume ("lvm not available", a
	// directory that cannot be read, a node not reachable); "" when it
	// does.
	State string `json:"state,omitempty"`
}

// VolumeCreate creates a volume from a storage pool.
func (c *ControlClient) VolumeCreate(ctx context.Context, r *VolumeCreateRequest) (*VolumeCreateReply, error) {
	return invoke[VolumeCreateReply](ctx, c, MethodVolumeCreate, r)
}

// VolumeDelete deletes a volume made by VolumeCreate.
func (c *ControlClient) VolumeDelete(ctx context.Context, r *VolumeDeleteRequest) (*VolumeDeleteReply, error) {
	return invoke[VolumeDeleteReply](ctx, c, MethodVolumeDelete, r)
}

// VolumeList lists every volume.
func (c *ControlClient) VolumeList(ctx context.Context, r *VolumeListRequest) (*VolumeListReply, error) {
	return invoke[VolumeListReply](ctx, c, MethodVolumeList, r)
}

// Pools lists every node's storage pools with their size and free space.
func (c *ControlClient) Pools(ctx context.Context, r *PoolsRequest) (*PoolsReply, error) {
	return invoke[PoolsReply](ctx, c, MethodPools, r)
}
