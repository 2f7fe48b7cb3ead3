package metadata

// InternalDeviceSize returns the smallest backing device, a multiple of
// 4 KiB, that holds size bytes of data and, at its end, internal metadata
// with alExtents hot extents (0: the default) and bitmaps for peers peers.
func InternalDeviceSize(size int64, alExtents, peers int) (int64, error) {
	return InternalDeviceSizeFor(size, alExtents, peers, false)
}

// InternalDeviceSizeFor is InternalDeviceSize for metadata with a
// checksum area when checksums (MDOptions.Checksums).
func InternalDeviceSizeFor(size int64, alExtents, peers int, checksums bool) (int64, error) {
	if alExtents == 0 {
		alExtents = DefaultALExtents
	}
	data := floorBlock(size + MDBlockSize - 1)
	g, err := computeGeometry(External, data, alExtents, peers, checksums)
	if err != nil {
		return 0, err
	}
	dev := data + g.mdSize
	for {
		g, err := computeGeometry(Internal, dev, alExtents, peers, checksums)
		if err != nil {
			return 0, err
		}
		if g.dataSize >= size {
			return dev, nil
		}
		dev += floorBlock(size - g.dataSize + MDBlockSize - 1)
	}
}

// ExternalSize returns the size of an external metadata file for a volume
// of size bytes.
func ExternalSize(size int64, alExtents, peers int) (int64, error) {
	return ExternalSizeFor(size, alExtents, peers, false)
}

// ExternalSizeFor is ExternalSize for metadata with a checksum area when
// checksums (MDOptions.Checksums).
func ExternalSizeFor(size int64, alExtents, peers int, checksums bool) (int64, error) {
	if alExtents == 0 {
		alExtents = DefaultALExtents
	}
	g, err := computeGeometry(External, size, alExtents, peers, checksums)
	if err != nil {
		return 0, err
	}
	return g.bitmapOffset + int64(peers)*g.bitmapPages*MDBlockSize, nil
}

// UsableSize returns the largest volume, a multiple of 4 KiB, that a
// backing device of deviceSize bytes holds with its metadata: for
// Internal, the metadata at its end with alExtents hot extents (0: the
// default) and bitmaps for peers peers; for External, none.
func UsableSize(p Placement, deviceSize int64, alExtents, peers int) (int64, error) {
	return UsableSizeFor(p, deviceSize, alExtents, peers, false)
}

// UsableSizeFor is UsableSize for metadata with a checksum area when
// checksums (MDOptions.Checksums).
func UsableSizeFor(p Placement, deviceSize int64, alExtents, peers int, checksums bool) (int64, error) {
	if alExtents == 0 {
		alExtents = DefaultALExtents
	}
	g, err := computeGeometry(p, deviceSize, alExtents, peers, checksums)
	if err != nil {
		return 0, err
	}
	return floorBlock(g.dataSize), nil
}
