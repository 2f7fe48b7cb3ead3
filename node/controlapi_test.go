package node

import (
	"testing"

	"github.com/replvol/replvol/metadata"
	"github.com/replvol/replvol/node/control"
)

// TestControlSizeUnitIsTheMetadataBlock: the control API refuses a
// resize to a size that is not a multiple of control.SizeUnit, since a
// volume grows in blocks of its on-disk metadata; the two must agree.
func TestControlSizeUnitIsTheMetadataBlock(t *testing.T) {
	if int64(control.SizeUnit) != int64(metadata.MDBlockSize) {
		t.Fatalf("control.SizeUnit is %d, metadata.MDBlockSize %d", control.SizeUnit, metadata.MDBlockSize)
	}
}
