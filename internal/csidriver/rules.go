package csidriver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/replvol/replvol/internal/caps"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	// BlockSize is the unit of a volume's size: a size asked for is rounded up to it.
	BlockSize = 4096
	// DefaultSize is the size of a volume whose capacity range names none.
	DefaultSize = 1 << 30
	// DefaultReplicas is the copies of a volume whose parameters name none (the control API's
	// default for 0).
	DefaultReplicas = 2

	// ParamReplicas, ParamPool and ParamProtocol are the StorageClass parameters CreateVolume
	// takes.
	ParamReplicas = "replicas"
	ParamPool     = "pool"
	ParamProtocol = "protocol"
	// kubernetesParamPrefix starts the parameters csi-provisioner adds itself (PVC name and
	// namespace, with --extra-create-metadata): they are not ours, and not refused.
	kubernetesParamPrefix = "csi.storage.k8s.io/"
)

// volumeSize is the size to create for a capacity range: the required bytes rounded up to
// BlockSize; with none, DefaultSize, or the limit rounded down when that is smaller. A range
// no multiple of BlockSize fits is codes.OutOfRange, negative bytes codes.InvalidArgument.
func volumeSize(r *csi.CapacityRange) (uint64, error) {
	required, limit := r.GetRequiredBytes(), r.GetLimitBytes()
	if required < 0 || limit < 0 {
		return 0, status.Errorf(codes.InvalidArgument, "capacity range: required_bytes %d, limit_bytes %d: give sizes of 0 or more bytes", required, limit)
	}
	if limit > 0 && required > limit {
		return 0, status.Errorf(codes.OutOfRange, "capacity range: required_bytes %d is more than limit_bytes %d", required, limit)
	}
	if required == 0 {
		size := uint64(DefaultSize)
		if limit > 0 {
			size = min(size, uint64(limit)/BlockSize*BlockSize)
		}
		if size == 0 {
			return 0, status.Errorf(codes.OutOfRange, "capacity range: limit_bytes %d is less than a block (%d bytes): give a larger limit", limit, BlockSize)
		}
		return size, nil
	}
	size := (uint64(required) + BlockSize - 1) / BlockSize * BlockSize
	if limit > 0 && size > uint64(limit) {
		return 0, status.Errorf(codes.OutOfRange, "capacity range: required_bytes %d rounded up to a whole %d-byte block is %d, more than limit_bytes %d: give a limit of at least %d", required, BlockSize, size, limit, size)
	}
	return size, nil
}

// fits says whether a volume of size meets the capacity range r (CreateVolume of a name that
// exists: AlreadyExists when it does not).
func fits(size uint64, r *csi.CapacityRange) bool {
	if req := r.GetRequiredBytes(); req > 0 && size < uint64(req) {
		return false
	}
	if lim := r.GetLimitBytes(); lim > 0 && size > uint64(lim) {
		return false
	}
	return true
}

// volumeParams are CreateVolume's parameters (a StorageClass's).
type volumeParams struct {
	Replicas int
	Pool     string
	Protocol string
}

// parseParams reads CreateVolume's parameters: replicas (a whole number of 1 or more), pool,
// protocol (A, B or C). Others are refused with codes.InvalidArgument, naming those known,
// except csi-provisioner's own (csi.storage.k8s.io/...).
func parseParams(params map[string]string) (volumeParams, error) {
	var p volumeParams
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := params[k]
		switch {
		case k == ParamReplicas:
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 1 {
				return p, status.Errorf(codes.InvalidArgument, "parameter %s %q: give a whole number of copies, 1 or more", k, v)
			}
			p.Replicas = n
		case k == ParamPool:
			p.Pool = strings.TrimSpace(v)
		case k == ParamProtocol:
			switch proto := strings.ToUpper(strings.TrimSpace(v)); proto {
			case "A", "B", "C":
				p.Protocol = proto
			default:
				return p, status.Errorf(codes.InvalidArgument, "parameter %s %q: give A, B or C", k, v)
			}
		case strings.HasPrefix(k, kubernetesParamPrefix):
		default:
			return p, status.Errorf(codes.InvalidArgument, "unknown parameter %q: replvol.csi.io takes %s, %s and %s", k, ParamReplicas, ParamPool, ParamProtocol)
		}
	}
	return p, nil
}

// page is the part [start, end) of a list of n volumes (sorted by name) that ListVolumes
// returns for a starting token and a maximum (0: all), and the token of the next page (""
// at the end). A token is the decimal index of
// the first name of its page; one that is not, or lies past the end, is codes.Aborted (the
// list changed, or the token was never ours), as CSI says.
func page(n int, token string, maxEntries int32) (start, end int, next string, err error) {
	if maxEntries < 0 {
		return 0, 0, "", status.Errorf(codes.InvalidArgument, "max_entries %d: give 0 (all) or more", maxEntries)
	}
	if token != "" {
		i, err := strconv.ParseUint(token, 10, 31)
		if err != nil || int(i) > n {
			return 0, 0, "", status.Errorf(codes.Aborted, "starting_token %q is not one ListVolumes gave for this list (%d volumes): list again from the start", token, n)
		}
		start = int(i)
	}
	end = n
	if maxEntries > 0 && start+int(maxEntries) < end {
		end = start + int(maxEntries)
		next = strconv.Itoa(end)
	}
	return start, end, next, nil
}

// supported says why a capability is not one replvol serves ("" when it is): one writer or
// readers on a single node, a mount (ext4 or xfs) or a raw block volume.
func supported(c *csi.VolumeCapability) string {
	if c == nil {
		return "an empty volume capability"
	}
	switch m := c.GetAccessMode().GetMode(); m {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER:
	default:
		return fmt.Sprintf("access mode %s: a replvol volume is used on one node at a time (SINGLE_NODE_WRITER, SINGLE_NODE_SINGLE_WRITER or SINGLE_NODE_READER_ONLY)", m)
	}
	switch t := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
	case *csi.VolumeCapability_Mount:
		switch fs := t.Mount.GetFsType(); fs {
		case "", "ext4", "xfs":
		default:
			return fmt.Sprintf("fs_type %q: replvol.csi.io makes and mounts ext4 or xfs", fs)
		}
	default:
		return "no access type: give mount or block"
	}
	return ""
}

// checkCapabilities refuses, with codes.InvalidArgument, no capabilities or one replvol does
// not serve.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "volume_capabilities: give at least one")
	}
	for _, c := range caps {
		if why := supported(c); why != "" {
			return status.Error(codes.InvalidArgument, why)
		}
	}
	return nil
}

// poolCapacity is the largest volume with replicas copies that the pool named pool ("":
// "default") has room for: the replicas-th largest free space among its nodes, since each
// copy needs a node of its own with that much free. Summing the nodes' free space would
// promise volumes no placement can hold.
func poolCapacity(pools []transport.PoolStatus, pool string, replicas int) uint64 {
	if pool == "" {
		pool = "default"
	}
	if replicas < 1 {
		replicas = DefaultReplicas
	}
	var free []uint64
	for _, p := range pools {
		if p.Name == pool {
			free = append(free, p.Free)
		}
	}
	if len(free) < replicas {
		return 0
	}
	slices.Sort(free)
	slices.Reverse(free)
	return free[replicas-1] / BlockSize * BlockSize
}

// apiError is the CSI error for a failed control API call: its own gRPC status as the node
// gave it (the control API's codes are CSI's), codes.DeadlineExceeded or codes.Canceled for
// the call's context, codes.Unavailable when the node could not be reached.
func apiError(what string, err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		return status.Errorf(st.Code(), "%s: %s", what, st.Message())
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "%s: %v", what, err)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "%s: %v", what, err)
	}
	return status.Errorf(codes.Unavailable, "%s: %v", what, err)
}

// growCapability is the capability the kernel asks of whoever grows a mounted file system of
// type fs: CAP_SYS_RESOURCE for ext2/3/4 (EXT4_IOC_RESIZE_FS, resize2fs), CAP_SYS_ADMIN for
// xfs (XFS_IOC_FSGROWFSDATA, xfs_growfs); its bit and name.
func growCapability(fs string) (bit uint, name string, ok bool) {
	switch fs {
	case "ext4", "ext3", "ext2":
		return caps.SysResource, "CAP_SYS_RESOURCE", true
	case "xfs":
		return caps.SysAdmin, "CAP_SYS_ADMIN", true
	}
	return 0, "", false
}

// missingGrowCapability is the name of the capability that growing a mounted fs needs and
// the effective set capEff (/proc/self/status's CapEff) lacks; "" when nothing lacks.
func missingGrowCapability(fs string, capEff uint64) string {
	bit, name, ok := growCapability(fs)
	if !ok || capEff&(1<<bit) != 0 {
		return ""
	}
	return name
}
