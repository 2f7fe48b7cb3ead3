package csidriver

import (
	"context"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ControllerGetCapabilities: volumes are created, deleted, listed and grown; capacity is
// reported per pool. There is no ControllerPublish: a node attaches a volume itself
// (NodeStageVolume), and the primary's mount claim keeps it to one node.
func (d *Driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, c := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// csiVolume is the CSI form of a volume: its ID is its name.
func csiVolume(v transport.VolumeInfo) *csi.Volume {
	ctx := map[string]string{ParamProtocol: v.Protocol}
	if v.Pool != "" {
		ctx[ParamPool] = v.Pool
	}
	return &csi.Volume{VolumeId: v.Name, CapacityBytes: int64(v.Size), VolumeContext: ctx}
}

// CreateVolume creates a volume from a pool through the control API, idempotently by name:
// the volume's ID is its name. The same name again with a size the capacity range allows
// changes nothing; with another size or definition it is codes.AlreadyExists.
func (d *Driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name: give the volume's name")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volume_content_source: replvol.csi.io makes empty volumes only (no snapshots or clones)")
	}
	size, err := volumeSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	p, err := parseParams(req.GetParameters())
	if err != nil {
		return nil, err
	}
	ctx, cancel := d.call(ctx)
	defer cancel()
	list, err := d.client.VolumeList(ctx, &transport.VolumeListRequest{})
	if err != nil {
		return nil, apiError("list the volumes", err)
	}
	for _, v := range list.Volumes {
		if v.Name != req.GetName() {
			continue
		}
		// A create again of a volume that exists: its size must meet the range asked for
		// now (Kubernetes retries with the same range; a size that changed is another volume).
		if !fits(v.Size, req.GetCapacityRange()) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s exists with %d bytes, outside the capacity range asked for (required %d, limit %d)",
				v.Name, v.Size, req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes())
		}
		size = v.Size
	}
	// One request ID for this call: the node that takes it asks again under
	// it when a raft leader change cuts the create off.
	r, err := d.client.VolumeCreate(ctx, &transport.VolumeCreateRequest{
		Name: req.GetName(), Size: size, Replicas: p.Replicas, Pool: p.Pool, Protocol: p.Protocol, RequestID: transport.NewRequestID()})
	if err != nil {
		return nil, apiError("create volume "+req.GetName(), err)
	}
	return &csi.CreateVolumeResponse{Volume: csiVolume(r.Volume)}, nil
}

// DeleteVolume deletes a volume made by CreateVolume; one that does not exist is done.
func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: give the volume's ID")
	}
	ctx, cancel := d.call(ctx)
	defer cancel()
	if _, err := d.client.VolumeDelete(ctx, &transport.VolumeDeleteRequest{Name: req.GetVolumeId()}); err != nil {
		return nil, apiError("delete volume "+req.GetVolumeId(), err)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// volume is the volume of that name, or codes.NotFound.
func (d *Driver) volume(ctx context.Context, name string) (transport.VolumeInfo, error) {
	ctx, cancel := d.call(ctx)
	defer cancel()
	list, err := d.client.VolumeList(ctx, &transport.VolumeListRequest{})
	if err != nil {
		return transport.VolumeInfo{}, apiError("list the volumes", err)
	}
	for _, v := range list.Volumes {
		if v.Name == name {
			return v, nil
		}
	}
	return transport.VolumeInfo{}, status.Errorf(codes.NotFound, "no volume %s in the cluster", name)
}

// ValidateVolumeCapabilities confirms the capabilities when replvol serves every one of them.
func (d *Driver) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: give the volume's ID")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities: give at least one")
	}
	if _, err := d.volume(ctx, req.GetVolumeId()); err != nil {
		return nil, err
	}
	for _, c := range req.GetVolumeCapabilities() {
		if why := supported(c); why != "" {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: why}, nil
		}
	}
	if _, err := parseParams(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext: req.GetVolumeContext(), VolumeCapabilities: req.GetVolumeCapabilities(), Parameters: req.GetParameters()}}, nil
}

// ListVolumes lists the cluster's volumes by name, a page at a time.
func (d *Driver) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	ctx, cancel := d.call(ctx)
	defer cancel()
	list, err := d.client.VolumeList(ctx, &transport.VolumeListRequest{})
	if err != nil {
		return nil, apiError("list the volumes", err)
	}
	vols := slices.Clone(list.Volumes)
	slices.SortFunc(vols, func(a, b transport.VolumeInfo) int { return strings.Compare(a.Name, b.Name) })
	start, end, next, err := page(len(vols), req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, v := range vols[start:end] {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: csiVolume(v)})
	}
	return resp, nil
}

// GetCapacity is the largest volume the pool (parameter pool) has room for with the copies
// asked for (parameter replicas, 2 by default): the replicas-th largest free space among the
// pool's nodes (poolCapacity says why not the sum).
func (d *Driver) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	for _, c := range req.GetVolumeCapabilities() {
		if why := supported(c); why != "" {
			return &csi.GetCapacityResponse{}, nil
		}
	}
	p, err := parseParams(req.GetParameters())
	if err != nil {
		return nil, err
	}
	ctx, cancel := d.call(ctx)
	defer cancel()
	pools, err := d.client.Pools(ctx, &transport.PoolsRequest{})
	if err != nil {
		return nil, apiError("list the pools", err)
	}
	c := int64(poolCapacity(pools.Pools, p.Pool, p.Replicas))
	return &csi.GetCapacityResponse{AvailableCapacity: c, MaximumVolumeSize: wrapperspb.Int64(c)}, nil
}

// ControllerExpandVolume grows a volume on every node (the control API's Resize, online). A
// mounted volume's file system is grown by NodeExpandVolume after.
func (d *Driver) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: give the volume's ID")
	}
	size, err := volumeSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	if req.GetCapacityRange().GetRequiredBytes() == 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity_range: give required_bytes, the size to grow to")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if why := supported(c); why != "" {
			return nil, status.Error(codes.InvalidArgument, why)
		}
	}
	v, err := d.volume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	nodeExpansion := req.GetVolumeCapability().GetBlock() == nil
	if v.Size >= size {
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: int64(v.Size), NodeExpansionRequired: nodeExpansion}, nil
	}
	// Every replica grows: a volume just created may not be open on each yet.
	if err := d.waitStarted(ctx, v.Name, heldEverywhere, d.cfg.CallTimeout); err != nil {
		return nil, err
	}
	ctx, cancel := d.call(ctx)
	defer cancel()
	r, err := d.client.Resize(ctx, &transport.ResizeRequest{Volume: v.Name, Size: int64(size)})
	if err != nil {
		return nil, apiError("grow volume "+v.Name, err)
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: r.Size, NodeExpansionRequired: nodeExpansion}, nil
}
