package node

import (
	"time"

	"github.com/replvol/replvol/internal/poll"
)

// within is the package's one polling loop (poll.Within): eventually,
// waitInSync, waitVolumeInSync and waitMetric wait through it, each
// stating what it waits for and what a timeout means.
func within(timeout, interval time.Duration, cond func() bool) bool {
	return poll.Within(timeout, interval, cond)
}
