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

// Signal sends sig to p if it is still the process recorded.
func (p Process) Signal(sig syscall.Signal) error {
	if !p.Alive() {
		return nil
	}
	return syscall.Kill(p.PID, sig)
}
