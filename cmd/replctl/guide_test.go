package main

// The documentation (README.md, CHANGELOG.md and docs/*.md) names only
// what exists: replctl and replnode commands and flags, relative links and
// their anchors, tests, metrics and make targets. docs_e2e_test.go runs the
// blocks a page marks runnable; this file checks everything else, without
// a cluster.

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// repoRoot is the repository, seen from this package's directory.
const repoRoot = "../.."

// docFiles are the pages the checks read, relative to the repository.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md", "CHANGELOG.md"}
	for _, p := range pages {
		rel, _ := filepath.Rel(repoRoot, p)
		files = append(files, rel)
	}
	if len(files) < 8 {
		t.Fatalf("only %v: the docs pages are missing", files)
	}
	return files
}

// mdBlock is a fenced code block of a page.
type mdBlock struct {
	info string // the info string after the opening fence ("sh", "sh tour", ...)
	line int    // the line of its first content line, 1-based
	text []string
}

// mdPage is a page split into its fenced blocks and the rest (prose,
// tables, headings).
type mdPage struct {
	path   string // relative to the repository
	blocks []mdBlock
	prose  []string // the lines outside fenced blocks, in order
}

func readPage(t *testing.T, rel string) *mdPage {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	p := &mdPage{path: rel}
	var cur *mdBlock
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		fence := strings.HasPrefix(strings.TrimSpace(line), "```")
		switch {
		case cur == nil && fence:
			cur = &mdBlock{info: strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "```")), line: n + 1}
		case cur != nil && fence:
			p.blocks = append(p.blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text = append(cur.text, line)
		default:
			p.prose = append(p.prose, line)
		}
	}
	if cur != nil {
		t.Fatalf("%s: the block opened at line %d is never closed", rel, cur.line-1)
	}
	return p
}

var codeSpan = regexp.MustCompile("`([^`\n]+)`")

// codeTexts are the page's code: each fenced block's lines (a line
// ending in a backslash joined to the next) and each code span of the
// prose, with a table's escaped bar (\|, alternatives) read as "/".
func (p *mdPage) codeTexts() []string {
	var out []string
	for _, b := range p.blocks {
		out = append(out, joinContinued(b.text)...)
	}
	for _, l := range p.prose {
		for _, m := range codeSpan.FindAllStringSubmatch(l, -1) {
			out = append(out, strings.ReplaceAll(m[1], `\|`, "/"))
		}
	}
	return out
}

// joinContinued joins each line ending in a backslash to the next.
func joinContinued(lines []string) []string {
	var out []string
	acc := ""
	for _, l := range lines {
		if strings.HasSuffix(l, `\`) {
			acc += strings.TrimSuffix(l, `\`) + " "
			continue
		}
		out = append(out, acc+l)
		acc = ""
	}
	if acc != "" {
		out = append(out, acc)
	}
	return out
}

// commandSegments cuts a line of shell into its simple commands: at
// "&&", "||", ";", "|", "$(", "<(", "(", ")" and a comment.
func commandSegments(line string) []string {
	if i := commentStart(line); i >= 0 {
		line = line[:i]
	}
	for _, sep := range []string{"&&", "||", "$(", "<(", ";", "|", "(", ")"} {
		line = strings.ReplaceAll(line, sep, "\x00")
	}
	return strings.Split(line, "\x00")
}

// commentStart is where a shell comment starts in line (a # at the start
// or after a blank, outside quotes), or -1.
func commentStart(line string) int {
	var quote rune
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return i
		}
	}
	return -1
}

// programWords returns, for each simple command in texts that runs the
// program name (name, ./name or a path ending in /name, after sudo or
// a YAML key), the words after it.
func programWords(texts []string, name string) [][]string {
	var out [][]string
	for _, text := range texts {
		for _, seg := range commandSegments(text) {
			words := strings.Fields(seg)
			for i, w := range words {
				if w == name || strings.HasSuffix(w, "/"+name) {
					out = append(out, words[i+1:])
					break
				}
			}
		}
	}
	return out
}

// globalValueFlags are replctl's persistent flags that take a value.
var globalValueFlags = map[string]bool{"--addr": true, "--tls-dir": true, "--timeout": true, "--color": true}

var alternatives = regexp.MustCompile(`^[a-z][a-z0-9-]*(/[a-z][a-z0-9-]*)+$`)

// variants expands the first word of alternatives ("list/fail/restore")
// into one word list per alternative.
func variants(words []string) [][]string {
	for i, w := range words {
		if alternatives.MatchString(w) {
			var out [][]string
			for _, alt := range strings.Split(w, "/") {
				v := append(append(append([]string(nil), words[:i]...), alt), words[i+1:]...)
				out = append(out, variants(v)...)
			}
			return out
		}
	}
	return [][]string{words}
}

// checkReplctlLine says what is wrong with `replctl WORDS` (nothing: "").
// checked is false when the words name no command to check (a
// placeholder such as SUBCOMMAND or "...").
func checkReplctlLine(root *cobra.Command, words []string) (problem string, checked bool) {
	var cleaned []string
	for _, w := range words {
		w = strings.Trim(w, "[]'\"")
		if w != "" {
			cleaned = append(cleaned, w)
		}
	}
	words = cleaned
	var globals []string
	for len(words) > 0 && strings.HasPrefix(words[0], "-") {
		name, _, hasValue := strings.Cut(words[0], "=")
		globals = append(globals, name)
		if globalValueFlags[name] && !hasValue && len(words) > 1 {
			words = words[2:]
		} else {
			words = words[1:]
		}
	}
	for _, g := range globals {
		if flagOf(root, g) == nil {
			return fmt.Sprintf("replctl has no flag %s", g), true
		}
	}
	if len(words) == 0 || !regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(words[0]) {
		return "", len(globals) > 0
	}
	cmd, rest, err := root.Find(words)
	if err != nil || cmd == root {
		return fmt.Sprintf("%q is no replctl command", words[0]), true
	}
	if cmd.HasSubCommands() && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		return fmt.Sprintf("%s has no subcommand %s", cmd.CommandPath(), rest[0]), true
	}
	for _, w := range rest {
		if !strings.HasPrefix(w, "-") || w == "-" || w == "--" {
			continue
		}
		name, _, _ := strings.Cut(w, "=")
		if flagOf(cmd, name) == nil {
			return fmt.Sprintf("%s has no flag %s", cmd.CommandPath(), name), true
		}
	}
	return "", true
}

// docRoot is replctl's command tree as a user meets it: with the help,
// version and completion that cobra adds when it runs.
func docRoot() *cobra.Command {
	root := newRoot()
	root.InitDefaultHelpFlag()
	root.InitDefaultVersionFlag()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	return root
}

// flagOf finds a flag (--name or -x) of cmd, its inherited ones included.
func flagOf(cmd *cobra.Command, flag string) any {
	if name, ok := strings.CutPrefix(flag, "--"); ok {
		if f := cmd.Flags().Lookup(name); f != nil {
			return f
		}
		if f := cmd.PersistentFlags().Lookup(name); f != nil {
			return f
		}
		if f := cmd.InheritedFlags().Lookup(name); f != nil {
			return f
		}
		if name == "help" {
			return name
		}
		return nil
	}
	short := strings.TrimPrefix(flag, "-")
	if len(short) != 1 {
		return nil
	}
	if f := cmd.Flags().ShorthandLookup(short); f != nil {
		return f
	}
	if f := cmd.PersistentFlags().ShorthandLookup(short); f != nil {
		return f
	}
	if f := cmd.InheritedFlags().ShorthandLookup(short); f != nil {
		return f
	}
	return nil
}

// TestTheDocsNameRealCommands: every `replctl ...` the README, the change
// log and every docs page but perf.md (make bench's record of a run) show, in code spans and blocks alike, resolves
// in replctl's command tree with its flags (a placeholder such as
// `replctl SUBCOMMAND --help` is skipped), and every `replnode --flag` is a
// flag of replnode (its man page, which TestTheManPageDescribesEveryFlag
// in cmd/replnode holds to replnode's flags).
func TestTheDocsNameRealCommands(t *testing.T) {
	replnodeFlags := replnodeManFlags(t)
	total := 0
	for _, file := range docFiles(t) {
		if file == "docs/perf.md" {
			continue // make bench's record of a run: output, not commands
		}
		page := readPage(t, file)
		texts := page.codeTexts()
		checked := 0
		for _, words := range programWords(texts, "replctl") {
			for _, v := range variants(words) {
				problem, ok := checkReplctlLine(docRoot(), v)
				if problem != "" {
					t.Errorf("%s: replctl %s: %s", file, strings.Join(words, " "), problem)
				}
				if ok {
					checked++
				}
			}
		}
		for _, words := range programWords(texts, "replnode") {
			for _, w := range words {
				name, _, _ := strings.Cut(strings.Trim(w, "[]"), "=")
				if strings.HasPrefix(name, "--") && !replnodeFlags[strings.TrimPrefix(name, "--")] {
					t.Errorf("%s: replnode %s: replnode has no flag %s", file, strings.Join(words, " "), name)
				}
			}
		}
		t.Logf("%s: %d replctl command lines checked", file, checked)
		total += checked
		if file == "docs/production.md" && checked < 10 {
			t.Errorf("checked only %d replctl commands in docs/production.md: the pattern misses them", checked)
		}
	}
	if total < 100 {
		t.Errorf("checked only %d replctl command lines in the docs: the pattern misses them", total)
	}
}

// replnodeManFlags are the flags replnode's man page describes.
func replnodeManFlags(t *testing.T) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "deploy/man/replnode.8"))
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{"help": true}
	for _, m := range regexp.MustCompile(`(?m)^\.BI? \\-\\-([a-z\\-]+)`).FindAllStringSubmatch(string(raw), -1) {
		flags[strings.ReplaceAll(m[1], `\-`, "-")] = true
	}
	if !flags["config"] || !flags["join"] {
		t.Fatalf("read %v from deploy/man/replnode.8: the pattern misses its flags", flags)
	}
	return flags
}

// TestTheCommandCheckCatchesWhatIsWrong: the check above fails a line
// that names no command, a subcommand or flag that does not exist, and
// passes the forms the docs use.
func TestTheCommandCheckCatchesWhatIsWrong(t *testing.T) {
	for _, tc := range []struct {
		line    string
		problem bool
	}{
		{"replctl status --check --json", false},
		{"replctl --addr unix:///var/lib/replvol/control.sock --tls-dir /etc/replvol/tls mount vol0 /srv/data -o noatime", false},
		{"replctl path list/fail/restore/rotate/policy", false},
		{"replctl adjust VOL --protocol A/B/C [--on-congestion block/pull-ahead/disconnect] [--resync-rate 50MiB]", false},
		{"replctl --version", false},
		{"replctl SUBCOMMAND --help", false},
		{"replctl stauts", true},
		{"replctl status --wtach", true},
		{"replctl path lsit vol0", true},
		{"replctl path list/flail", true},
		{"replctl --adrr 127.0.0.1:7800 status", true},
		{"replctl mount vol0 /srv -x", true},
	} {
		words := programWords([]string{tc.line}, "replctl")
		if len(words) != 1 {
			t.Fatalf("%q: found %d replctl commands, want 1", tc.line, len(words))
		}
		var problems []string
		for _, v := range variants(words[0]) {
			if p, _ := checkReplctlLine(docRoot(), v); p != "" {
				problems = append(problems, p)
			}
		}
		if (len(problems) > 0) != tc.problem {
			t.Errorf("%q: problems %q, want a problem: %v", tc.line, problems, tc.problem)
		}
	}
}

var mdLink = regexp.MustCompile(`\[[^\]\n]*\]\(([^)\s]+)\)`)

// TestTheDocsLinksResolve: every relative link of the README, the change
// log and the docs pages names a file that exists, and every #anchor a
// heading of the page it points into (GitHub's anchors).
func TestTheDocsLinksResolve(t *testing.T) {
	anchors := map[string]map[string]bool{}
	anchorsOf := func(rel string) map[string]bool {
		if a, ok := anchors[rel]; ok {
			return a
		}
		a := map[string]bool{}
		for _, h := range headingSlugs(readPage(t, rel)) {
			a[h] = true
		}
		anchors[rel] = a
		return a
	}
	links := 0
	for _, file := range docFiles(t) {
		page := readPage(t, file)
		for _, l := range page.prose {
			for _, m := range mdLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(l, ""), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				path, anchor, _ := strings.Cut(target, "#")
				rel := file
				if path != "" {
					rel = filepath.Clean(filepath.Join(filepath.Dir(file), path))
					if _, err := os.Stat(filepath.Join(repoRoot, rel)); err != nil {
						t.Errorf("%s: the link %s: %v", file, target, err)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(rel, ".md") {
					t.Errorf("%s: the link %s has an anchor into a file that is no page", file, target)
					continue
				}
				if !anchorsOf(rel)[anchor] {
					var have []string
					for a := range anchorsOf(rel) {
						have = append(have, a)
					}
					sort.Strings(have)
					t.Errorf("%s: the link %s: %s has no heading #%s (it has %s)", file, target, rel, anchor, strings.Join(have, ", "))
				}
			}
		}
	}
	if links < 40 {
		t.Errorf("found only %d relative links: the pattern misses them", links)
	}
}

// headingSlugs are a page's anchors as GitHub makes them: each heading
// lowercased, without punctuation but hyphens and underscores, spaces
// made hyphens, "-1", "-2" after a repeated one.
func headingSlugs(p *mdPage) []string {
	seen := map[string]int{}
	var out []string
	for _, l := range p.prose {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && isLetter(r):
				b.WriteRune(r)
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", slug, n))
		} else {
			out = append(out, slug)
		}
		seen[slug]++
	}
	return out
}

func isLetter(r rune) bool { return strings.ToLower(string(r)) != strings.ToUpper(string(r)) }

// TestHeadingSlugsAreGitHubs pins the anchor rule on headings of the pages.
func TestHeadingSlugsAreGitHubs(t *testing.T) {
	p := &mdPage{prose: []string{
		"## Mounting a volume: `replctl mount`, and the hooks",
		"## replctl status --check",
		"## 4. Size `al_extents` from the resync rate",
		"## Notes", "## Notes",
	}}
	want := []string{"mounting-a-volume-replctl-mount-and-the-hooks", "replctl-status---check", "4-size-al_extents-from-the-resync-rate", "notes", "notes-1"}
	if got := headingSlugs(p); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("headingSlugs = %q, want %q", got, want)
	}
}

var testName = regexp.MustCompile(`\b((?:Test|Fuzz|Benchmark)[A-Z0-9][A-Za-z0-9_]*)(\.\.\.)?`)

// TestTheDocsNameTestsThatExist: every test, fuzz target and benchmark a
// page names is a function of some _test.go file of the repository ("X..."
// names those starting with X).
func TestTheDocsNameTestsThatExist(t *testing.T) {
	funcs := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)\w+)\(`)
	err := filepath.WalkDir(repoRoot, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, "_test.go") {
			raw, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range decl.FindAllStringSubmatch(string(raw), -1) {
				funcs[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := 0
	for _, file := range docFiles(t) {
		raw, err := os.ReadFile(filepath.Join(repoRoot, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range testName.FindAllStringSubmatch(string(raw), -1) {
			name, prefix := m[1], m[2] != ""
			named++
			found := funcs[name]
			if prefix {
				for f := range funcs {
					found = found || strings.HasPrefix(f, name)
				}
			}
			if !found {
				t.Errorf("%s names %s%s: no test, fuzz target or benchmark of that name", file, name, m[2])
			}
		}
	}
	if named < 100 {
		t.Errorf("found only %d test names in the docs: the pattern misses them", named)
	}
}

// TestTheDocsNameRealMetricsAndMakeTargets: every replvol_ metric a page
// names is defined by node/metrics.go, and every `make TARGET` is a
// target of the Makefile.
func TestTheDocsNameRealMetricsAndMakeTargets(t *testing.T) {
	metricsSrc, err := os.ReadFile(filepath.Join(repoRoot, "node/metrics.go"))
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z-]*):`).FindAllStringSubmatch(string(makefile), -1) {
		targets[m[1]] = true
	}
	metric := regexp.MustCompile(`\breplvol_([a-z_]+[a-z])`)
	makeCmd := regexp.MustCompile(`(?:^|[\s;&(])make ([a-z][a-z-]*)`)
	metrics, makes := 0, 0
	for _, file := range docFiles(t) {
		page := readPage(t, file)
		raw, _ := os.ReadFile(filepath.Join(repoRoot, file))
		for _, m := range metric.FindAllStringSubmatch(string(raw), -1) {
			name := m[1]
			for _, suffix := range []string{"_count", "_sum", "_bucket"} {
				name = strings.TrimSuffix(name, suffix)
			}
			metrics++
			if !strings.Contains(string(metricsSrc), `"`+name+`"`) {
				t.Errorf("%s names the metric replvol_%s, which node/metrics.go does not define", file, m[1])
			}
		}
		for _, text := range page.codeTexts() {
			if i := commentStart(text); i >= 0 {
				text = text[:i]
			}
			for _, m := range makeCmd.FindAllStringSubmatch(text, -1) {
				makes++
				if !targets[m[1]] {
					t.Errorf("%s: make %s: the Makefile has no target %s", file, m[1], m[1])
				}
			}
		}
	}
	if metrics < 10 || makes < 10 {
		t.Errorf("found only %d metric names and %d make commands in the docs: the patterns miss them", metrics, makes)
	}
}

// TestEveryPackageSaysItsJob: every directory of the module that holds a
// package (a .go file that is not a test) has a doc.go whose comment
// begins "Package NAME", or "Command NAME" for a command (STYLE.md: each
// package says its job there).
func TestEveryPackageSaysItsJob(t *testing.T) {
	pkgs := map[string]bool{}
	err := filepath.WalkDir(repoRoot, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			pkgs[filepath.Dir(path)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pkgClause := regexp.MustCompile(`(?m)^package (\w+)`)
	for _, dir := range slices.Sorted(maps.Keys(pkgs)) {
		rel, _ := filepath.Rel(repoRoot, dir)
		raw, err := os.ReadFile(filepath.Join(dir, "doc.go"))
		if err != nil {
			t.Errorf("%s: no doc.go saying the package's job", rel)
			continue
		}
		m := pkgClause.FindSubmatch(raw)
		if m == nil {
			t.Errorf("%s/doc.go: no package clause", rel)
			continue
		}
		want := "// Package " + string(m[1]) + " "
		if string(m[1]) == "main" {
			want = "// Command " + filepath.Base(dir) + " "
		}
		if !strings.HasPrefix(string(raw), want) {
			t.Errorf("%s/doc.go: its comment does not begin %q", rel, strings.TrimPrefix(want, "// "))
		}
	}
	if len(pkgs) < 40 {
		t.Fatalf("found %d packages under %s: the walk missed the module", len(pkgs), repoRoot)
	}
}
