package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// simPackage is the simulation the mutations are run against, and
// simTest its test.
const (
	simPackage = "./node/sim/"
	simTest    = "TestSim$"
)

// options are the command line's.
type options struct {
	// root is the module's root (where go.mod is).
	root  string
	seeds int
	// only runs one mutation (by name); seed, with only, replays one
	// seed of it with the whole trace.
	only    string
	seed    uint64
	list    bool
	timeout time.Duration
	goCmd   string
	// mutations are the ones to judge (the table, mutations).
	mutations []Mutation
}

// Result says what the simulation, or the test that judges it, did with
// one mutation.
type Result int

const (
	// Caught: a seed broke an invariant (or the mutation's test failed).
	Caught Result = iota + 1
	// Missed: every seed passed with the mutation planted (or its test).
	Missed
	// NoLongerApplies: the text it patches is not in its file exactly once.
	NoLongerApplies
	// Error: it could not be judged (it does not build, go test failed
	// without a broken invariant, its test fails without it too).
	Error
)

func (r Result) String() string {
	switch r {
	case Caught:
		return "CAUGHT"
	case Missed:
		return "MISSED"
	case NoLongerApplies:
		return "NO LONGER APPLIES"
	case Error:
		return "ERROR"
	}
	return "Result(?)"
}

// row is one mutation's line of the table.
type row struct {
	m       Mutation
	where   string
	result  Result
	failure *SimFailure
	// testFailure is the first line the mutation's test logged as it
	// failed, for one judged by a test and caught.
	testFailure string
	// note says why, for a mutation missed, no longer applying or in error.
	note string
	took time.Duration
}

// errUsage is a bad command line (exit 2); errFailed, mutations missed or
// not judged (exit 1).
var (
	errUsage  = errors.New("usage")
	errFailed = errors.New("mutations missed or not judged")
)

func main() {
	var o options
	flag.IntVar(&o.seeds, "seeds", 1000, "how many seeds the simulation runs per mutation (seeds 1 to N)")
	flag.StringVar(&o.only, "only", "", "run only the mutation NAME (see -list)")
	flag.Uint64Var(&o.seed, "seed", 0, "with -only: replay this seed of the mutation, printing its whole trace")
	flag.BoolVar(&o.list, "list", false, "list the mutations and where each is planted")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Minute, "go test's -timeout for one run of the simulation over -seeds seeds (a mutation given more seeds gets as much more)")
	flag.StringVar(&o.goCmd, "go", "go", "the go command")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mutants: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		os.Exit(2)
	}
	o.root, o.mutations = root, mutations
	err = run(context.Background(), o, os.Stdout)
	switch {
	case err == nil:
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "mutants:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "mutants:", err)
		os.Exit(1)
	}
}

// moduleRoot is the directory of the go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no go.mod above the working directory: run it in the repository (make mutants)")
		}
		dir = up
	}
}

// run does what o says, writing to w; it returns errFailed (wrapped)
// when a mutation was missed or could not be judged.
func run(ctx context.Context, o options, w io.Writer) error {
	if o.seeds < 1 {
		return fmt.Errorf("%w: -seeds %d: give 1 or more", errUsage, o.seeds)
	}
	if o.seed != 0 && o.only == "" {
		return fmt.Errorf("%w: -seed replays one mutation's seed: give -only NAME too", errUsage)
	}
	if o.goCmd == "" {
		o.goCmd = "go"
	}
	todo := o.mutations
	if o.only != "" {
		i := slices.IndexFunc(todo, func(m Mutation) bool { return m.Name == o.only })
		if i < 0 {
			return fmt.Errorf("%w: no mutation %q; they are: %s", errUsage, o.only, strings.Join(names(o.mutations), ", "))
		}
		todo = todo[i : i+1]
	}
	tmp, err := os.MkdirTemp("", "replvol-mutants-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	if o.list {
		return list(w, o.root, todo, tmp)
	}
	if o.seed != 0 {
		if m := todo[0]; m.Test.set() {
			return fmt.Errorf("%w: %s is judged by %s, not by seeds: run it with -only %s alone", errUsage, m.Name, m.Test, m.Name)
		}
		return replay(ctx, o, todo[0], tmp, w)
	}

	began := time.Now()
	var linked map[string]bool
	if slices.ContainsFunc(todo, func(m Mutation) bool { return !m.Test.set() }) {
		if linked, err = simDeps(ctx, o); err != nil {
			return err
		}
		if err := o.simControl(ctx, w); err != nil {
			return err
		}
	}

	var rows []row
	for i, m := range todo {
		r := judge(ctx, o, m, filepath.Join(tmp, fmt.Sprint(i)), linked)
		fmt.Fprintf(w, "%-30s %s (%s)\n", m.Name, r.result, r.took.Round(100*time.Millisecond))
		rows = append(rows, r)
	}
	fmt.Fprintln(w)
	table(w, rows, o.seeds)
	byTest := 0
	for _, r := range rows {
		if r.m.Test.set() {
			byTest++
		}
	}
	fmt.Fprintf(w, "\n%d mutations, %d seeds each (more where a mutation says so", len(rows), o.seeds)
	if byTest > 0 {
		fmt.Fprintf(w, "; %d judged by a test instead", byTest)
	}
	fmt.Fprintf(w, "), in %v\n", time.Since(began).Round(time.Second))
	bad := 0
	for _, r := range rows {
		if r.result != Caught {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%w: %d of %d", errFailed, bad, len(rows))
	}
	return nil
}

// simControl runs the simulation with no mutation: an error when it does
// not pass (then no mutation is run).
func (o options) simControl(ctx context.Context, w io.Writer) error {
	fmt.Fprintf(w, "control: the simulation with no mutation, %d seeds\n", o.seeds)
	out, exitOK, err := o.sim(ctx, "", "-seeds", fmt.Sprint(o.seeds))
	if err != nil {
		return err
	}
	outcome, f, perr := parseSimOutput(out, exitOK)
	switch outcome {
	case Failed:
		return fmt.Errorf("the simulation fails with no mutation planted (%s at seed %d step %d: %s): fix that first, no mutation was run; replay: %s",
			f.Invariant, f.Seed, f.Step, f.Detail, f.Replay)
	case Broken:
		return fmt.Errorf("the simulation does not run with no mutation planted, no mutation was run: %w", perr)
	}
	return nil
}

// judge plants m in dir, checks that its packages build with it, and runs
// the simulation against it (or the test that judges it).
func judge(ctx context.Context, o options, m Mutation, dir string, linked map[string]bool) row {
	began := time.Now()
	r := row{m: m}
	defer func() { r.took = time.Since(began) }()
	pl, err := plant(o.root, m, dir)
	if err != nil {
		r.result, r.note = Error, err.Error()
		if errors.Is(err, errNoLongerApplies) {
			r.result = NoLongerApplies
		}
		r.took = time.Since(began)
		return r
	}
	r.where = pl.Where()
	// A patch that does not compile must not pass for a mutation the
	// simulation misses (a package the simulation does not link is
	// never compiled by it).
	args := append([]string{"build", "-overlay", pl.Overlay}, pl.Packages...)
	if out, err := o.goOutput(ctx, args...); err != nil {
		r.result, r.note = Error, fmt.Sprintf("it does not build: %v\n%s", err, indent(tail(out, 15)))
		r.took = time.Since(began)
		return r
	}
	if m.Test.set() {
		judgeByTest(ctx, o, m, pl, &r)
		r.took = time.Since(began)
		return r
	}
	seeds := max(o.seeds, m.Seeds)
	so := o
	// -timeout is for -seeds: more seeds take as much longer.
	so.timeout = o.timeout * time.Duration((seeds+o.seeds-1)/o.seeds)
	out, exitOK, err := so.sim(ctx, pl.Overlay, "-seeds", fmt.Sprint(seeds))
	if err != nil {
		r.result, r.note = Error, err.Error()
		r.took = time.Since(began)
		return r
	}
	outcome, f, perr := parseSimOutput(out, exitOK)
	if outcome == Failed && f.Seed > uint64(o.seeds) {
		// Beyond the control's seeds: the seed must pass without the
		// mutation, or the mutation is not what failed it.
		cout, cok, cerr := o.sim(ctx, "", "-seed", fmt.Sprint(f.Seed))
		if c, _, _ := parseSimOutput(cout, cok); cerr != nil || c != Passed {
			r.result, r.note = Error, fmt.Sprintf("seed %d fails without the mutation too (or did not run: %v)", f.Seed, cerr)
			return r
		}
	}
	switch outcome {
	case Failed:
		r.result, r.failure = Caught, f
	case Passed:
		r.result = Missed
		var unlinked []string
		for _, p := range pl.Packages {
			if !linked[p] {
				unlinked = append(unlinked, strings.TrimSuffix(strings.TrimPrefix(p, "./"), "/"))
			}
		}
		if len(unlinked) > 0 {
			r.note = fmt.Sprintf("the simulation does not link %s (it models that code)", strings.Join(unlinked, ", "))
		}
	default:
		r.result, r.note = Error, perr.Error()
	}
	r.took = time.Since(began)
	return r
}

// judgeByTest runs m's test with m planted (pl): CAUGHT when it fails,
// once it passes without m; MISSED when it passes.
func judgeByTest(ctx context.Context, o options, m Mutation, pl Planted, r *row) {
	out, exitOK, err := o.test(ctx, pl.Overlay, m.Test)
	if err != nil {
		r.result, r.note = Error, err.Error()
		return
	}
	outcome, line, perr := parseTestOutput(m.Test.Run, out, exitOK)
	switch outcome {
	case Passed:
		r.result = Missed
		return
	case Broken:
		r.result, r.note = Error, perr.Error()
		return
	}
	// The test must pass without the mutation, or the mutation is not
	// what failed it.
	cout, cok, err := o.test(ctx, "", m.Test)
	if err != nil {
		r.result, r.note = Error, fmt.Sprintf("%s without the mutation: %v", m.Test, err)
		return
	}
	switch c, cline, cerr := parseTestOutput(m.Test.Run, cout, cok); c {
	case Failed:
		r.result, r.note = Error, fmt.Sprintf("%s fails without the mutation too: %s", m.Test, cline)
	case Broken:
		r.result, r.note = Error, fmt.Sprintf("%s does not run without the mutation: %v", m.Test, cerr)
	default:
		r.result, r.testFailure = Caught, line
	}
}

// table prints one line per mutation, then the notes.
func table(w io.Writer, rows []row, seeds int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MUTATION\tPLANTED IN\tRESULT\tINVARIANT\tSEED\tSTEP\tREPLAY")
	for _, r := range rows {
		inv, seed, step, rep := "-", "-", "-", "-"
		if f := r.failure; f != nil {
			inv, seed, step = f.Invariant, fmt.Sprint(f.Seed), fmt.Sprint(f.Step)
			rep = replayCommand(r.m.Name, f.Seed)
		}
		if r.m.Test.set() && r.result == Caught {
			inv, rep = r.m.Test.String(), "go run ./internal/mutants -only "+r.m.Name
		}
		where := r.where
		if where == "" {
			where = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.m.Name, where, r.result, inv, seed, step, rep)
	}
	tw.Flush()
	for _, r := range rows {
		switch {
		case r.m.Test.set() && r.result == Caught:
			fmt.Fprintf(w, "\n%s CAUGHT by %s (%s): %s\n", r.m.Name, r.m.Test, r.m.Why, r.testFailure)
		case r.m.Test.set() && r.result == Missed:
			fmt.Fprintf(w, "\n%s MISSED: %s (%s) passed with it planted (%s)\n", r.m.Name, r.m.Test, r.m.Test.Pkg, r.m.Rule)
		case r.result == Missed:
			fmt.Fprintf(w, "\n%s MISSED: every one of %d seeds passed with it planted (%s)", r.m.Name, max(seeds, r.m.Seeds), r.m.Rule)
			if r.note != "" {
				fmt.Fprintf(w, "; %s", r.note)
			}
			fmt.Fprintln(w)
		case r.result != Caught:
			fmt.Fprintf(w, "\n%s %s: %s\n", r.m.Name, r.result, r.note)
		}
	}
}

// replayCommand replays seed of the mutation name, with its trace.
func replayCommand(name string, seed uint64) string {
	return fmt.Sprintf("go run ./internal/mutants -only %s -seed %d", name, seed)
}

// list prints every mutation, where it is planted and the rule it breaks;
// one that no longer applies is an error.
func list(w io.Writer, root string, ms []Mutation, tmp string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MUTATION\tPLANTED IN\tBREAKS")
	var errs []error
	for i, m := range ms {
		pl, err := plant(root, m, filepath.Join(tmp, fmt.Sprint(i)))
		where := pl.Where()
		if err != nil {
			errs = append(errs, err)
			where = "(does not apply)"
		}
		breaks := m.Rule
		if m.Test.set() {
			breaks += " [judged by " + m.Test.String() + ": " + m.Why + "]"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", m.Name, where, breaks)
	}
	tw.Flush()
	return errors.Join(errs...)
}

// replay runs one seed of m with its whole trace, printing go test's
// output; it returns an error when the seed broke an invariant.
func replay(ctx context.Context, o options, m Mutation, tmp string, w io.Writer) error {
	pl, err := plant(o.root, m, filepath.Join(tmp, "replay"))
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%s planted in %s; seed %d:\n", m.Name, pl.Where(), o.seed)
	out, exitOK, err := o.sim(ctx, pl.Overlay, "-seed", fmt.Sprint(o.seed), "-fulltrace", "-v")
	fmt.Fprint(w, out)
	if err != nil {
		return err
	}
	outcome, f, perr := parseSimOutput(out, exitOK)
	switch outcome {
	case Failed:
		return fmt.Errorf("with %s planted, seed %d broke %s at step %d (the sim's replay line above runs without the mutation: %s)",
			m.Name, f.Seed, f.Invariant, f.Step, replayCommand(m.Name, f.Seed))
	case Broken:
		return perr
	}
	fmt.Fprintf(w, "with %s planted, seed %d held every invariant\n", m.Name, o.seed)
	return nil
}

// simDeps is the set of the module's packages (as "./node/volstate") the
// simulation's test links.
func simDeps(ctx context.Context, o options) (map[string]bool, error) {
	mod, err := o.goOutput(ctx, "list", "-m")
	if err != nil {
		return nil, fmt.Errorf("go list -m: %w: %s", err, mod)
	}
	mod = strings.TrimSpace(mod)
	out, err := o.goOutput(ctx, "list", "-deps", "-test", simPackage)
	if err != nil {
		return nil, fmt.Errorf("go list -deps -test %s: %w: %s", simPackage, err, out)
	}
	linked := map[string]bool{}
	for _, p := range strings.Fields(out) {
		if rest, ok := strings.CutPrefix(p, mod+"/"); ok {
			linked["./"+rest] = true
		}
	}
	return linked, nil
}

// sim runs the simulation's test with overlay ("" for none) and the
// test's own flags: its output and whether go test exited 0. err is an
// error of running go itself.
func (o options) sim(ctx context.Context, overlay string, testFlags ...string) (string, bool, error) {
	return o.goTest(ctx, overlay, append([]string{"-run", simTest, simPackage}, testFlags...)...)
}

// test runs the test t with overlay ("" for none), once: its output and
// whether go test exited 0. err is an error of running go itself.
func (o options) test(ctx context.Context, overlay string, t ByTest) (string, bool, error) {
	return o.goTest(ctx, overlay, "-run", "^"+t.Run+"$", t.Pkg)
}

// goTest runs go test once (-count=1, under o's timeout) with overlay
// ("" for none) and args: its output and whether it exited 0. err is an
// error of running go itself.
func (o options) goTest(ctx context.Context, overlay string, args ...string) (string, bool, error) {
	all := []string{"test", "-count=1", "-timeout", o.timeout.String()}
	if overlay != "" {
		all = append(all, "-overlay", overlay)
	}
	all = append(all, args...)
	out, err := o.goOutput(ctx, all...)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out, true, nil
	case errors.As(err, &exit):
		return out, false, nil
	}
	return out, false, fmt.Errorf("%s %s: %w", o.goCmd, strings.Join(all, " "), err)
}

// goOutput runs the go command in the module's root: its output (stdout
// and stderr).
func (o options) goOutput(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, o.goCmd, args...)
	cmd.Dir = o.root
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

func names(ms []Mutation) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}
