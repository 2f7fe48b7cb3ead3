package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/node"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/status"
)

// A volume's size in the file changes nothing at a SIGHUP, nor at a
// restart: a node runs a volume at the size it recorded, which only an
// online resize grows (replctl resize). After one, the operator writes
// the new size into the file: a SIGHUP takes it as the size the node runs
// at already. A file that says another size is told how to get there.

// sizeNote is what a SIGHUP says of a volume whose size the file changed.
type sizeNote struct {
	volume string
	// file is the file's size now (node.SizeMax for max), runs the size
	// the node runs the volume at.
	file, runs int64
}

// matches reports whether the file now says the size the node runs at.
func (s sizeNote) matches() bool { return s.file == s.runs || s.file == int64(node.SizeMax) }

// takeSizes takes the changes of volumes' sizes out of restart, which
// would not apply them either. runs holds the sizes this node runs its
// volumes at; a volume it does not hold gets no note.
func takeSizes(restart []change, next *node.Config, runs map[string]int64) ([]change, []sizeNote) {
	var kept []change
	var notes []sizeNote
	for _, c := range restart {
		name, isVolume := strings.CutPrefix(c.field, "volumes[")
		name, isSize := strings.CutSuffix(name, "].size")
		if !isVolume || !isSize || volumeNamed(next, name) == nil {
			kept = append(kept, c)
			continue
		}
		if size, held := runs[name]; held {
			notes = append(notes, sizeNote{volume: name, file: int64(volumeNamed(next, name).Size), runs: size})
		}
	}
	return kept, notes
}

// sizes asks the node the sizes it runs its volumes at when the file
// changed one, logs what the file's size means, and returns the other
// changes, and whether a size changed; a size the node runs at already is
// taken into the running config.
func (r *reloader) sizes(ctx context.Context, next *node.Config, restart []change) ([]change, bool) {
	if kept, _ := takeSizes(restart, next, nil); len(kept) == len(restart) {
		return restart, false
	}
	runs := map[string]int64{}
	client, err := transport.DialControl(r.control)
	if err == nil {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var ns *transport.NodeStatus
		if ns, err = client.NodeStatus(sctx, &transport.StatusRequest{}); err == nil {
			for _, lv := range ns.Volumes {
				runs[lv.Name] = lv.Size
			}
		}
		cancel()
		client.Close()
	}
	if err != nil {
		r.log.Error("SIGHUP: cannot ask the node the sizes of its volumes; a size in the file changes nothing (replctl resize grows a volume)", "err", status.Convert(err).Message())
	}
	kept, notes := takeSizes(restart, next, runs)
	for _, s := range notes {
		if s.matches() {
			r.log.Info(fmt.Sprintf("SIGHUP: volumes[%s].size is the size %s runs at on this node", s.volume, s.volume), "size", s.runs)
			if v := volumeNamed(r.running, s.volume); v != nil {
				v.Size = volumeNamed(next, s.volume).Size
			}
			continue
		}
		r.log.Warn(fmt.Sprintf("SIGHUP: volumes[%s].size is %s in the file, but %s runs at %s on this node: editing the file does not resize a volume; grow every node's disk, then replctl resize %s %s",
			s.volume, human.ExactBytes(s.file), s.volume, human.ExactBytes(s.runs), s.volume, human.ExactBytes(s.file)))
	}
	return kept, true
}
