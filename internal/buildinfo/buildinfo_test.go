package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

func TestStringNamesReleaseAndGoVersion(t *testing.T) {
	got := String("1.2.3")
	if !strings.HasPrefix(got, "1.2.3 ("+runtime.Version()) || !strings.HasSuffix(got, ")") {
		t.Fatalf("String(1.2.3) = %q", got)
	}
}
