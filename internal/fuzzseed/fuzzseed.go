package fuzzseed

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

var write = flag.Bool("write-fuzz-seeds", false, "rewrite the committed seed corpora under testdata/fuzz")

// Seed is one seed: the fuzz function's arguments after its *testing.T.
type Seed []any

// Encode renders a seed as a corpus file, as go test -fuzz writes one.
// It takes the argument types the project's fuzz targets use.
func Encode(s Seed) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("go test fuzz v1\n")
	for _, v := range s {
		switch v := v.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", v)
		case string:
			fmt.Fprintf(&b, "string(%q)\n", v)
		case bool, int, int64, uint16, uint32, uint64:
			fmt.Fprintf(&b, "%T(%v)\n", v, v)
		default:
			return nil, fmt.Errorf("fuzz seed argument of type %T", v)
		}
	}
	return b.Bytes(), nil
}

// Check is how Sync compares the committed corpus with the seeds.
type Check int

const (
	// Exact: each seed-NN file holds seed NN as the encoders make it now
	// (a format change that stales the corpus fails the test).
	Exact Check = iota
	// Present: each seed-NN file is there (for seeds that differ at every
	// run, such as a TLS ClientHello's random).
	Present
)

var seedName = regexp.MustCompile(`^seed-\d+$`)

// Sync compares the committed corpus testdata/fuzz/target with seeds and
// fails t where they differ; run with -write-fuzz-seeds it rewrites the
// seed-NN files instead. Files of other names (inputs the fuzzer found
// failing) are never touched: they stay in the corpus.
func Sync(t *testing.T, target string, seeds []Seed, check Check) {
	t.Helper()
	dir := filepath.Join("testdata", "fuzz", target)
	files := make([][]byte, len(seeds))
	for i, s := range seeds {
		f, err := Encode(s)
		if err != nil {
			t.Fatalf("%s seed %d: %v", target, i, err)
		}
		files[i] = f
	}
	if *write {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		old, _ := os.ReadDir(dir)
		for _, e := range old {
			if seedName.MatchString(e.Name()) {
				if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i, f := range files {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), f, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	for i, f := range files {
		name := filepath.Join(dir, fmt.Sprintf("seed-%02d", i))
		got, err := os.ReadFile(name)
		switch {
		case err != nil:
			t.Errorf("seed corpus of %s: %v; run go test -run %s -write-fuzz-seeds", target, err, t.Name())
		case check == Exact && !bytes.Equal(got, f):
			t.Errorf("seed corpus of %s: %s is not what the encoders make now; run go test -run %s -write-fuzz-seeds", target, name, t.Name())
		}
	}
}
