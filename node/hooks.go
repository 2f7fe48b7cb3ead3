package node

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// hookTimeout bounds one on_promote or on_demote command.
const hookTimeout = time.Minute

// runHook runs the volume's on_promote or on_demote command in the
// background, with the volume, the node, the epoch and the export in its
// environment; its exit status and the tail of its output become an event.
// It never holds up the role change it follows.
func (v *Volume) runHook(kind string, epoch uint64) {
	command := v.cfg.OnPromote
	if kind == "on_demote" {
		command = v.cfg.OnDemote
	}
	if command == "" {
		return
	}
	export := v.node.nbdURI(v.self, v.name)
	v.bg.Add(1)
	go func() {
		defer v.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), hookTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
		cmd.Env = append(os.Environ(),
			"REPLVOL_VOLUME="+v.name, "REPLVOL_NODE="+v.self,
			fmt.Sprintf("REPLVOL_EPOCH=%d", epoch), "REPLVOL_EXPORT="+export, "REPLVOL_HOOK="+kind)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		began := v.clock.Now()
		err := cmd.Run()
		tail := strings.TrimSpace(out.String())
		if len(tail) > 512 {
			tail = "..." + tail[len(tail)-512:]
		}
		if err != nil {
			v.log.Error("hook failed", "hook", kind, "command", command, "err", err, "output", tail)
			v.node.event(v.name, "hook-failed", fmt.Sprintf("%s %q failed after %.1fs: %v: %s", kind, command, v.clock.Since(began).Seconds(), err, tail))
			return
		}
		v.log.Info("hook ran", "hook", kind, "command", command, "output", tail)
		v.node.event(v.name, "hook", fmt.Sprintf("%s %q ran in %.1fs", kind, command, v.clock.Since(began).Seconds()))
	}()
}
