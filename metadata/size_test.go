package metadata

import "testing"

func TestInternalDeviceSizeFitsTheData(t *testing.T) {
	for _, size := range []int64{1 << 20, 256 << 20, 1 << 30, 1<<40 + 4096} {
		dev, err := InternalDeviceSize(size, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		g, err := computeGeometry(Internal, dev, DefaultALExtents, 1)
		if err != nil || g.dataSize < size {
			t.Fatalf("size %d: device %d holds %d (%v)", size, dev, g.dataSize, err)
		}
		smaller, _ := computeGeometry(Internal, dev-MDBlockSize, DefaultALExtents, 1)
		if smaller.dataSize >= size {
			t.Fatalf("size %d: device %d is not the smallest", size, dev)
		}
	}
}
