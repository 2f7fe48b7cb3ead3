package node

import (
	"fmt"
	"strings"
	"time"

	"github.com/replvol/replvol/transport"
)

// A reload's outcome, as the node reports it. replnode re-reads the
// cluster file on SIGHUP; a file that does not load changes nothing, and
// the node runs on with the config it had. That must not go unseen: the
// node keeps the failure (which file, when, its first problems) and shows
// it in its own view (NodeInfo.FailedReload), hence in status, its
// warnings (web.Warnings: reload-failed) and status --check, and records
// an event. The next reload whose file loads clears it.

// failedReloadProblems is how many of a broken file's problems the status
// carries; the rest are counted (the log has them all).
const failedReloadProblems = 5

// ReloadFailed records that a reload of file failed with err (the config
// loader's report, one problem a line), at now. It is safe for concurrent
// use.
func (n *Node) ReloadFailed(file string, err error, now time.Time) {
	var problems []string
	for _, line := range strings.Split(err.Error(), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			problems = append(problems, line)
		}
	}
	fr := &transport.FailedReload{File: file, At: now.UTC(), Problems: problems}
	if len(problems) > failedReloadProblems {
		fr.Problems, fr.More = problems[:failedReloadProblems], len(problems)-failedReloadProblems
	}
	n.mu.Lock()
	n.failedReload = fr
	n.mu.Unlock()
	n.event("", "reload-failed", fmt.Sprintf("%s's reload failed: its cluster file %s does not load, and it runs on with the config it had: %s",
		n.name, file, failedReloadWords(fr)))
}

// Reloaded records a reload of file whose config loaded: a failed reload
// before it is over.
func (n *Node) Reloaded(file string) {
	n.mu.Lock()
	was := n.failedReload
	n.failedReload = nil
	n.mu.Unlock()
	msg := fmt.Sprintf("%s reloaded its cluster file %s", n.name, file)
	if was != nil {
		msg += fmt.Sprintf("; the failed reload of %s is over", was.At.Format("15:04:05 UTC"))
	}
	n.event("", "reloaded", msg)
}

// failedReloadView is a copy of the node's failed reload, nil when its
// last reload loaded (or there was none).
func (n *Node) failedReloadView() *transport.FailedReload {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.failedReload == nil {
		return nil
	}
	fr := *n.failedReload
	fr.Problems = append([]string(nil), fr.Problems...)
	return &fr
}

// failedReloadWords lists a failed reload's problems on one line.
func failedReloadWords(fr *transport.FailedReload) string {
	s := strings.Join(fr.Problems, "; ")
	if fr.More > 0 {
		s += fmt.Sprintf("; and %d more", fr.More)
	}
	return s
}
