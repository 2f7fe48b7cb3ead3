package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/replvol/replvol/replication"
)

// TestForwardErrorsKeepTheirClass: every error class the leader can
// return crosses a forward (as JSON, as the node layer carries it) and
// still matches its sentinel with errors.Is, with its text intact; an
// error of no known class keeps its text.
func TestForwardErrorsKeepTheirClass(t *testing.T) {
	va := replication.VolumeAuthority{Primary: "a", Epoch: 3}
	roundTrip := func(err error) ForwardReply {
		raw, jerr := json.Marshal(replyOf(va, err))
		if jerr != nil {
			t.Fatal(jerr)
		}
		var back ForwardReply
		if jerr := json.Unmarshal(raw, &back); jerr != nil {
			t.Fatal(jerr)
		}
		return back
	}
	for _, e := range errorCodes {
		sent := fmt.Errorf("volume %q: %w", "vol", e.err)
		back := roundTrip(sent)
		if got := back.Err(); !errors.Is(got, e.err) || got.Error() != sent.Error() || back.Volume.Epoch != 3 {
			t.Errorf("%s came back as %v (%+v)", e.code, got, back)
		}
	}
	if back := roundTrip(nil); back.Err() != nil {
		t.Errorf("success came back as %v", back.Err())
	}
	if got := roundTrip(errors.New("disk on fire")).Err(); got == nil || got.Error() != "disk on fire" {
		t.Errorf("an unclassed error came back as %v", got)
	}
}
