package metadata

import "testing"

func TestInternalDeviceSizeFitsTheData(t *testing.T) {
	for _, size := range []int64{1 << 20, 256 << 20, 1 << 30, 1<<40 + 4096} {
		dev, err := InternalDeviceSize(size, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		g, err := computeGeometry(Internal, dev, DefaultALExtents, 1, false)
		if err != nil || g.dataSize < size {
			t.Fatalf("size %d: device %d holds %d (%v)", size, dev, g.dataSize, err)
		}
		smaller, _ := computeGeometry(Internal, dev-MDBlockSize, DefaultALExtents, 1, false)
		if smaller.dataSize >= size {
			t.Fatalf("size %d: device %d is not the smallest", size, dev)
		}
	}
}

// TestUsableSizeIsTheLargestThatFits: the usable size of a device is a
// volume whose internal metadata fits beside it on the device, and a
// volume one block larger does not fit; with external metadata it is the
// device, in whole blocks.
func TestUsableSizeIsTheLargestThatFits(t *testing.T) {
	for _, dev := range []int64{8 << 20, 256<<20 + 12345, 1 << 30, 1<<40 + 4096} {
		for _, peers := range []int{1, 2} {
			usable, err := UsableSize(Internal, dev, 0, peers)
			if err != nil {
				t.Fatal(err)
			}
			need, err := InternalDeviceSize(usable, 0, peers)
			if err != nil || need > dev || usable%MDBlockSize != 0 {
				t.Fatalf("device %d, %d peers: usable %d needs a device of %d (%v)", dev, peers, usable, need, err)
			}
			if more, _ := InternalDeviceSize(usable+MDBlockSize, 0, peers); more <= dev {
				t.Fatalf("device %d, %d peers: usable %d, but %d fits too", dev, peers, usable, usable+MDBlockSize)
			}
		}
		if ext, err := UsableSize(External, dev, 0, 1); err != nil || ext != dev&^(MDBlockSize-1) {
			t.Fatalf("external, device %d: usable %d, %v", dev, ext, err)
		}
	}
	if _, err := UsableSize(Internal, 8<<10, 0, 1); err == nil {
		t.Fatal("an 8 KiB device holds internal metadata and a volume")
	}
}
