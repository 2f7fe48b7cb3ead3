package volmount

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Process names a process beyond its PID: the PID and its start time (field 22 of
// /proc/PID/stat), so that a recorded helper is never confused with a process that reuses its
// PID after it ended.
type Process struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// processOf reads pid's start time.
func processOf(pid int) (Process, error) {
	start, state, err := procStat(pid)
	if err != nil {
		return Process{}, err
	}
	if state == 'Z' {
		return Process{}, fmt.Errorf("process %d has exited", pid)
	}
	return Process{PID: pid, Start: start}, nil
}

// procStat reads pid's start time and state from /proc/PID/stat.
func procStat(pid int) (start uint64, state byte, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name, in parentheses, may hold spaces and parentheses: fields start after
	// the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(string(b[i+1:]))
	// fields[0] is field 3 (state); the start time is field 22.
	if len(fields) < 20 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)+2)
	}
	start, err = strconv.ParseUint(fields[19], 10, 64)
	if err != nil || len(fields[0]) != 1 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	return start, fields[0][0], nil
}

// Alive reports whether p still runs (a zombie does not).
func (p Process) Alive() bool {
	if p.PID <= 0 {
		return false
	}
	start, state, err := procStat(p.PID)
	return err == nil && start == p.Start && state != 'Z'
}

// Stays reports whether p runs and goes on running: alive, and neither
// killed (a SIGKILL pending, which it has not acted on yet) nor exiting.
// A helper just killed (kill -9) is still alive for a moment, longer on
// a loaded machine: its mount is no longer served, and may be made again.
func (p Process) Stays() bool {
	if !p.Alive() {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
	if err != nil {
		return false
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
	if err != nil {
		return false
	}
	return !ending(stat, status)
}

// pfExiting is the kernel's PF_EXITING, in the flags of /proc/PID/stat
// (field 9): the process is in its exit.
const pfExiting = 0x4

// ending reports, from a process's /proc/PID/stat and /proc/PID/status,
// whether it exits or has a SIGKILL pending (the signal masks SigPnd, for
// the thread, and ShdPnd, for the process: bit 8 is signal 9). A text it
// cannot read says it is not ending: it is then taken as running, as
// Alive says.
func ending(stat, status []byte) bool {
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
		fields := strings.Fields(string(stat[i+1:]))
		// fields[0] is field 3 (state), so the flags, field 9, are fields[6].
		if len(fields) > 6 {
			if fields[0] == "X" {
				return true
			}
			if flags, err := strconv.ParseUint(fields[6], 10, 64); err == nil && flags&pfExiting != 0 {
				return true
			}
		}
	}
	for _, line := range strings.Split(string(status), "\n") {
		name, mask, ok := strings.Cut(line, ":")
		if !ok || (name != "SigPnd" && name != "ShdPnd") {
			continue
		}
		if bits, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64); err == nil && bits&(1<<(syscall.SIGKILL-1)) != 0 {
			return true
		}
	}
	return false
}

// Signal sends sig to p if it is still the process recorded.
func (p Process) Signal(sig syscall.Signal) error {
	if !p.Alive() {
		return nil
	}
	return syscall.Kill(p.PID, sig)
}
