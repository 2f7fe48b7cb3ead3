package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const sampleGo = `package a

type T struct{}

// M is a method.
func (t *T) M(x int) int {
	if x > 0 {
		return x
	}
	return 0
}

func F() bool { return true }
`

// module writes a module of one package, a, under a temporary root.
func module(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"go.mod": "module example.com/m\n\ngo 1.26\n", "a/a.go": sampleGo} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func readOverlay(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var o struct{ Replace map[string]string }
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatalf("the overlay is not go's JSON: %v\n%s", err, b)
	}
	return o.Replace
}

// The overlay maps the real file, by its absolute path, to a patched copy
// in the mutation's directory; the tree is left as it was.
func TestPlantMapsTheRealFileToAPatchedCopy(t *testing.T) {
	root := module(t)
	dir := t.TempDir()
	m := Mutation{Name: "positive-is-zero", Edits: []Edit{
		{File: "a/a.go", Find: "\tif x > 0 {", Replace: "\tif x > 1 {"},
		{File: "a/a.go", Find: "return x\n", Replace: "return -x\n"},
	}}
	pl, err := plant(root, m, dir)
	if err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(root, "a", "a.go")
	replace := readOverlay(t, pl.Overlay)
	if len(replace) != 1 || replace[real] == "" {
		t.Fatalf("overlay replaces %v, want only %s", replace, real)
	}
	if !filepath.IsAbs(replace[real]) || !strings.HasPrefix(replace[real], dir+string(filepath.Separator)) {
		t.Fatalf("the patched copy %s is not an absolute path in the mutation's directory %s", replace[real], dir)
	}
	got, err := os.ReadFile(replace[real])
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(strings.Replace(sampleGo, "x > 0", "x > 1", 1), "return x\n", "return -x\n", 1)
	if string(got) != want {
		t.Fatalf("patched copy:\n%s\nwant:\n%s", got, want)
	}
	if orig, _ := os.ReadFile(real); string(orig) != sampleGo {
		t.Fatalf("plant changed the real file:\n%s", orig)
	}
	if len(pl.Packages) != 1 || pl.Packages[0] != "./a" {
		t.Fatalf("packages %q, want [./a]", pl.Packages)
	}
	if w := pl.Where(); w != "a/a.go:(*T).M" {
		t.Fatalf("planted in %q, want a/a.go:(*T).M", w)
	}
}

// A mutation whose text is not in its file exactly once no longer applies:
// the error names it and the text, and nothing is planted.
func TestPlantRefusesTextMissingOrFoundTwice(t *testing.T) {
	root := module(t)
	for _, c := range []struct {
		name, find string
		count      string
	}{
		{"text-gone", "if x >= 0 {", "0 times"},
		{"text-twice", "\treturn ", "2 times"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := plant(root, Mutation{Name: c.name, Edits: []Edit{{File: "a/a.go", Find: c.find, Replace: "x"}}}, dir)
			if !errors.Is(err, errNoLongerApplies) {
				t.Fatalf("err %v, want errNoLongerApplies", err)
			}
			for _, want := range []string{c.name, "a/a.go", c.count, c.find} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q: %v", want, err)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "overlay.json")); !os.IsNotExist(err) {
				t.Errorf("an overlay was written for a mutation that does not apply (%v)", err)
			}
		})
	}
}

// A patch that leaves the file unparsable is refused before any build.
func TestPlantRefusesAPatchThatDoesNotParse(t *testing.T) {
	root := module(t)
	_, err := plant(root, Mutation{Name: "broken", Edits: []Edit{{File: "a/a.go", Find: "func F() bool {", Replace: "func F() bool {{"}}}, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "broken") || !strings.Contains(err.Error(), "does not parse") {
		t.Fatalf("err %v, want the mutation named and that its file does not parse", err)
	}
}

// Every mutation of the table applies to the tree as it is: one whose
// text the code no longer holds must be rewritten (make mutants refuses to
// run it).
func TestEveryMutationAppliesToTheTree(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, m := range mutations {
		if seen[m.Name] {
			t.Errorf("two mutations are named %s", m.Name)
		}
		seen[m.Name] = true
		if m.Rule == "" {
			t.Errorf("%s says no rule it breaks", m.Name)
		}
		if m.Test.set() {
			testJudgedIsWhole(t, root, m)
		}
		pl, err := plant(root, m, filepath.Join(t.TempDir(), strconv.Itoa(i)))
		if err != nil {
			t.Error(err)
			continue
		}
		for _, s := range pl.Sites {
			if s.Function == "" {
				t.Errorf("%s: an edit of %s is in no function", m.Name, s.File)
			}
		}
	}
	if len(mutations) < 8 {
		t.Errorf("%d mutations; issue 28 lists eight at least", len(mutations))
	}
}

// testJudgedIsWhole checks a mutation judged by a test: it says why the
// simulation cannot judge it, gives itself no seeds, and its test is a
// function of its package's test files.
func testJudgedIsWhole(t *testing.T, root string, m Mutation) {
	t.Helper()
	if m.Why == "" || m.Test.Pkg == "" {
		t.Errorf("%s is judged by %s but says no package or no reason the simulation cannot judge it", m.Name, m.Test)
	}
	if m.Seeds != 0 {
		t.Errorf("%s is judged by %s, not by seeds, yet gives itself %d", m.Name, m.Test, m.Seeds)
	}
	files, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(m.Test.Pkg), "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == m.Test.Run {
				return
			}
		}
	}
	t.Errorf("%s is judged by %s, which no test file of %s declares", m.Name, m.Test, m.Test.Pkg)
}

// A real failure of TestSim (node/sim's own planted bug skip-lease-fence,
// captured in testdata) gives the invariant, seed, step and the sim's
// replay command.
func TestParseSimFailureOfARealRun(t *testing.T) {
	out, err := os.ReadFile(filepath.Join("testdata", "sim-one-writer.txt"))
	if err != nil {
		t.Fatal(err)
	}
	outcome, f, err := parseSimOutput(string(out), false)
	if err != nil || outcome != Failed {
		t.Fatalf("outcome %v, err %v; want Failed", outcome, err)
	}
	want := SimFailure{Invariant: "one-writer", Seed: 5, Step: 169, At: "8.45s", Detail: "[alpha beta] serve with leases at once",
		Replay: "go test -run 'TestSim$' ./node/sim/ -seed 5 -steps 600 -fulltrace -v"}
	if *f != want {
		t.Fatalf("parsed %+v\nwant   %+v", *f, want)
	}
}

func TestParseSimOutputWithoutAFailure(t *testing.T) {
	if o, f, err := parseSimOutput("ok  \tgithub.com/replvol/replvol/node/sim\t1.881s\n", true); o != Passed || f != nil || err != nil {
		t.Fatalf("a pass: %v %v %v", o, f, err)
	}
	buildFailed := "# github.com/replvol/replvol/node/volstate\nTMP/step.go:461:30: syntax error: unexpected !=, expected expression\nFAIL\tgithub.com/replvol/replvol/node/sim [build failed]\nFAIL\n"
	o, _, err := parseSimOutput(buildFailed, false)
	if o != Broken || err == nil || !strings.Contains(err.Error(), "syntax error") {
		t.Fatalf("a build failure: %v %v, want Broken with go's message", o, err)
	}
	captured, rerr := os.ReadFile(filepath.Join("testdata", "sim-one-writer.txt"))
	if rerr != nil {
		t.Fatal(rerr)
	}
	if o, _, err := parseSimOutput(string(captured), true); o != Broken || err == nil {
		t.Fatalf("a failure reported with exit 0: %v %v, want Broken", o, err)
	}
}

// The tool run for real on one mutation the simulation catches today
// (a primary that serves after its lease ran out): CAUGHT, with the
// invariant, a seed and a step; and its replay command replays it. About
// one seed in six catches it (10, 16, 22, 25, ... when written), so 50
// seeds leave room for changes to the simulation's draws.
func TestMutantsCatchesServingAfterTheLease(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	o := options{root: root, seeds: 50, only: "serve-after-lease", timeout: 3 * time.Minute, goCmd: "go", mutations: mutations}
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	line := regexp.MustCompile(`(?m)^serve-after-lease +node/volstate/state\.go:Admit +CAUGHT +one-writer +(\d+) +(\d+) +go run \./internal/mutants -only serve-after-lease -seed (\d+)$`)
	m := line.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no CAUGHT line with its seed and step:\n%s", out.String())
	}
	seed, _ := strconv.ParseUint(m[1], 10, 64)
	if seed < 1 || seed > 50 || m[3] != m[1] {
		t.Fatalf("seed %s (replay %s), want one of the 50 run:\n%s", m[1], m[3], out.String())
	}

	// Its replay runs that seed with the mutation and breaks the same
	// invariant at the same step, the whole trace printed.
	out.Reset()
	o.seed = seed
	err = run(context.Background(), o, &out)
	if want := "broke one-writer at step " + m[2] + " "; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("replay of seed %d: err %v, want %q", seed, err, want)
	}
	if !strings.Contains(out.String(), "INVARIANT one-writer BROKEN") || !strings.Contains(out.String(), "=== RUN   TestSim") {
		t.Fatalf("the replay printed no trace of the broken invariant:\n%s", tail(out.String(), 20))
	}
}

// A mutation that no longer applies, or whose patch does not build, is no
// verdict: the run fails and says which, after the control passed. The
// one that does not build is in a package the simulation does not link
// (internal/human), so that only the tool's own build of it can tell.
func TestMutantsFailsOnAMutationItCannotJudge(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bad := []Mutation{
		{Name: "gone", Rule: "r", Edits: []Edit{{File: "node/volstate/state.go", Find: "text no file holds", Replace: "x"}}},
		{Name: "no-build", Rule: "r", Edits: []Edit{{File: "internal/human/human.go", Find: "func ExactBytes(n int64) string {", Replace: "func ExactBytes(n int64) string {\n\tundefinedName()"}}},
	}
	var out bytes.Buffer
	o := options{root: root, seeds: 2, timeout: 3 * time.Minute, goCmd: "go", mutations: bad}
	err = run(context.Background(), o, &out)
	if !errors.Is(err, errFailed) {
		t.Fatalf("err %v, want errFailed\n%s", err, out.String())
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^gone +- +NO LONGER APPLIES`),
		regexp.MustCompile(`(?m)^no-build +internal/human/human\.go:ExactBytes +ERROR`),
		regexp.MustCompile(`text no file holds`),
		regexp.MustCompile(`undefinedName`),
	} {
		if !want.MatchString(out.String()) {
			t.Errorf("the output does not match %s:\n%s", want, out.String())
		}
	}
}

// When the simulation fails with no mutation planted, the tool stops and
// says so: no mutation runs. The go command is a script that fails every
// go test as TestSim did on a real failure (the fault injected) and
// records how it was called.
func TestMutantsStopsWhenTheControlFails(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	capture, err := filepath.Abs(filepath.Join("testdata", "sim-one-writer.txt"))
	if err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho \"$*\" >>'" + calls + "'\ncase \"$1\" in\n" +
		"list) [ \"$2\" = -m ] && echo github.com/replvol/replvol || echo github.com/replvol/replvol/node/sim; exit 0;;\n" +
		"test) cat '" + capture + "'; exit 1;;\nesac\nexit 0\n"
	goCmd := filepath.Join(dir, "go")
	if err := os.WriteFile(goCmd, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	o := options{root: root, seeds: 3, timeout: time.Minute, goCmd: goCmd, mutations: mutations}
	err = run(context.Background(), o, &out)
	if err == nil || errors.Is(err, errFailed) || !strings.Contains(err.Error(), "fails with no mutation planted") ||
		!strings.Contains(err.Error(), "one-writer at seed 5 step 169") {
		t.Fatalf("err %v, want the control's failure (one-writer at seed 5 step 169)\n%s", err, out.String())
	}
	b, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count("\n"+string(b), "\ntest "); n != 1 || strings.Contains(string(b), "-overlay") {
		t.Fatalf("go was called so, want one go test and no overlay:\n%s", b)
	}
}

// A real failure of a test that judges a mutation (node's, with
// pull-write-any-peer planted, captured in testdata) gives the first line
// the test logged, not a line of the nodes' logs printed after it.
func TestParseTestFailureOfARealRun(t *testing.T) {
	out, err := os.ReadFile(filepath.Join("testdata", "test-pull-write-any-peer.txt"))
	if err != nil {
		t.Fatal(err)
	}
	const name = "TestAWriteDuringAPullIsAcknowledgedOnlyOnceItsSourceTookIt"
	outcome, line, err := parseTestOutput(name, string(out), false)
	want := "pullsource_test.go:106: beta acknowledged a write during its pull that gamma, the pull's source, did not take (alpha holds it: true)"
	if outcome != Failed || err != nil || line != want {
		t.Fatalf("outcome %v, line %q, err %v; want Failed with %q", outcome, line, err, want)
	}
	if o, _, err := parseTestOutput("TestOther", string(out), false); o != Broken || err == nil {
		t.Fatalf("another test's failure: %v %v, want Broken", o, err)
	}
	if o, _, err := parseTestOutput(name, "ok  \tgithub.com/replvol/replvol/node\t0.041s [no tests to run]\n", true); o != Broken || err == nil {
		t.Fatalf("no test ran: %v %v, want Broken", o, err)
	}
}

// mutatedByTestGo is a test file for module's package a: TestF pins F,
// nothing pins M, and TestAlwaysFails fails with or without a mutation.
const mutatedByTestGo = `package a

import "testing"

func TestF(t *testing.T) {
	if !F() {
		t.Fatal("F is false")
	}
}

func TestAlwaysFails(t *testing.T) { t.Fatal("always") }
`

// The tool run for real on mutations judged by a test, in a module of its
// own: a mutation the test fails on is CAUGHT, naming the test and the
// line it failed with; one it passes with is MISSED; one whose test fails
// without the mutation too, or names no test of the package, is an
// ERROR. No simulation runs (none of them is judged by it), and -seed has
// no meaning for them.
func TestMutantsJudgesAMutationByItsTest(t *testing.T) {
	root := module(t)
	if err := os.WriteFile(filepath.Join(root, "a", "a_test.go"), []byte(mutatedByTestGo), 0o644); err != nil {
		t.Fatal(err)
	}
	falseF := Edit{File: "a/a.go", Find: "func F() bool { return true }", Replace: "func F() bool { return false }"}
	ms := []Mutation{
		{Name: "f-false", Rule: "F is false", Edits: []Edit{falseF}, Test: ByTest{Pkg: "./a/", Run: "TestF"}, Why: "no simulation here"},
		{Name: "m-negated", Rule: "M is negated", Edits: []Edit{{File: "a/a.go", Find: "return x\n", Replace: "return -x\n"}}, Test: ByTest{Pkg: "./a/", Run: "TestF"}, Why: "no simulation here"},
		{Name: "fails-anyway", Rule: "F is false", Edits: []Edit{falseF}, Test: ByTest{Pkg: "./a/", Run: "TestAlwaysFails"}, Why: "no simulation here"},
		{Name: "no-such-test", Rule: "F is false", Edits: []Edit{falseF}, Test: ByTest{Pkg: "./a/", Run: "TestNone"}, Why: "no simulation here"},
	}
	var out bytes.Buffer
	o := options{root: root, seeds: 1, timeout: time.Minute, goCmd: "go", mutations: ms}
	err := run(context.Background(), o, &out)
	if !errors.Is(err, errFailed) || !strings.Contains(err.Error(), "3 of 4") {
		t.Fatalf("err %v, want errFailed, 3 of 4\n%s", err, out.String())
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^f-false +a/a\.go:F +CAUGHT +test TestF +- +- +go run \./internal/mutants -only f-false$`),
		regexp.MustCompile(`(?m)^m-negated +a/a\.go:\(\*T\)\.M +MISSED +- +- +- +-$`),
		regexp.MustCompile(`(?m)^fails-anyway +a/a\.go:F +ERROR `),
		regexp.MustCompile(`(?m)^no-such-test +a/a\.go:F +ERROR `),
		regexp.MustCompile(`(?m)^f-false CAUGHT by test TestF \(no simulation here\): a_test\.go:\d+: F is false$`),
		regexp.MustCompile(`(?m)^m-negated MISSED: test TestF \(\./a/\) passed with it planted \(M is negated\)$`),
		regexp.MustCompile(`(?m)^fails-anyway ERROR: test TestAlwaysFails fails without the mutation too`),
		regexp.MustCompile(`(?m)^no-such-test ERROR: no test TestNone ran`),
		regexp.MustCompile(`; 4 judged by a test instead\)`),
	} {
		if !want.MatchString(out.String()) {
			t.Errorf("the output does not match %s:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "control:") {
		t.Errorf("the simulation's control ran though no mutation is judged by it:\n%s", out.String())
	}

	// One alone: caught, exit 0.
	out.Reset()
	o.only = "f-false"
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatalf("-only f-false: %v\n%s", err, out.String())
	}
	o.seed = 3
	if err := run(context.Background(), o, &out); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "judged by test TestF") {
		t.Fatalf("-only f-false -seed 3: err %v, want a usage error naming the test", err)
	}
}
