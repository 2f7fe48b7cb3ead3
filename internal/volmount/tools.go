package volmount

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// MissingToolError is a program this host lacks, with the Debian package that has it.
type MissingToolError struct {
	Tool, Package string
}

func (e *MissingToolError) Error() string {
	return fmt.Sprintf("%s not found: install %s (the Debian package)", e.Tool, e.Package)
}

// toolPackages names the package of every program volmount runs.
var toolPackages = map[string]string{
	"losetup":   "util-linux",
	"blkid":     "util-linux",
	"mount":     "mount",
	"mkfs.ext4": "e2fsprogs",
	"mkfs.xfs":  "xfsprogs",
}

// lookTool finds a program on PATH or in the system directories (a hook's PATH may lack
// /sbin).
func lookTool(tool string) (string, error) {
	if p, err := exec.LookPath(tool); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(d, tool)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &MissingToolError{Tool: tool, Package: toolPackages[tool]}
}

// ToolError is a program that failed: its exit status and what it said.
type ToolError struct {
	Command string
	Code    int
	Output  string
}

func (e *ToolError) Error() string {
	out := strings.TrimSpace(e.Output)
	if out == "" {
		return fmt.Sprintf("%s failed (exit status %d)", e.Command, e.Code)
	}
	return fmt.Sprintf("%s failed (exit status %d): %s", e.Command, e.Code, out)
}

// runTool runs a program and returns its standard output; a failure is a *ToolError (or a
// *MissingToolError).
func runTool(ctx context.Context, tool string, args ...string) (string, error) {
	path, err := lookTool(tool)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return stdout.String(), &ToolError{Command: tool + " " + strings.Join(args, " "), Code: exit.ExitCode(), Output: stderr.String() + stdout.String()}
	}
	if err != nil {
		return stdout.String(), fmt.Errorf("%s: %w", tool, err)
	}
	return stdout.String(), nil
}
