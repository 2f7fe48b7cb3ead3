package config

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Loading a config file finds every problem at once. The file is parsed
// into yaml.v3's node tree first, and the tree is walked beside the Config
// type: a key no field has is named with the nearest valid one, a value
// that does not fit its field is named, and each is taken out of the tree
// so that the rest decodes and validates too. Every problem carries the
// field's path (volumes[0].size) and its line.

// Problem is one thing wrong in a config file.
type Problem struct {
	// Field is the path of the field, as the file nests it:
	// "volumes[0].size"; "" for the file as a whole.
	Field string
	// Line is the 1-based line in the file; 0 when not known (a missing
	// field of a file that has no such section).
	Line int
	// Message says what is wrong and what would be right.
	Message string
}

// ConfigError lists every problem of a config, one per line of its
// Error text: "cluster.yaml:12: volumes[0].replicaton: unknown key; did
// you mean "replication"?".
type ConfigError struct {
	// File is the config file ("" for a config built in memory).
	File     string
	Problems []Problem
}

func (e *ConfigError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		var b strings.Builder
		switch {
		case e.File != "" && p.Line > 0:
			fmt.Fprintf(&b, "%s:%d: ", e.File, p.Line)
		case e.File != "":
			b.WriteString(e.File + ": ")
		case p.Line > 0:
			fmt.Fprintf(&b, "line %d: ", p.Line)
		}
		if p.Field != "" {
			b.WriteString(p.Field + ": ")
		}
		b.WriteString(p.Message)
		lines[i] = b.String()
	}
	return strings.Join(lines, "\n")
}

// maxConfigValues bounds the values of a file the loader walks (aliases
// could make a small file expand enormously).
const maxConfigValues = 100000

// configLoader walks a file's node tree. It records the line of every
// field path and the paths whose value was refused (their validation
// problems would only repeat that).
type configLoader struct {
	problems []Problem
	lines    map[string]int
	refused  []string
	values   int
}

// Parse decodes and validates a config file's text, as LoadConfig does;
// file names it in the problems.
func Parse(file string, data []byte) (*Config, error) { return parse(file, data, "") }

// parse is Parse; for a node ("" for none) it checks what the file names
// for it on this host too (LoadNodeConfig), in the same report.
func parse(file string, data []byte, node string) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		// Syntax: yaml.v3's parser stops at the first error, which names
		// its line.
		return nil, &ConfigError{File: file, Problems: []Problem{{Message: err.Error()}}}
	}
	l := &configLoader{lines: map[string]int{}}
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		if !l.walk("", root.Content[0], reflect.TypeFor[Config]()) {
			root.Content[0] = nullNode(root.Content[0])
		}
	}
	var c Config
	if root.Kind == yaml.DocumentNode {
		if err := root.Decode(&c); err != nil {
			// The walk took out what does not fit; this is only what it
			// did not foresee.
			if te, ok := err.(*yaml.TypeError); ok {
				for _, msg := range te.Errors {
					l.problems = append(l.problems, Problem{Message: msg})
				}
			} else {
				l.problems = append(l.problems, Problem{Message: err.Error()})
			}
		}
	}
	ps := c.problems()
	if node != "" {
		ps = append(ps, c.nodeProblems(file, node)...)
	}
	for _, p := range ps {
		if l.isRefused(p.Field) {
			continue
		}
		p.Line = l.lineOf(p.Field)
		l.problems = append(l.problems, p)
	}
	if len(l.problems) > 0 {
		sort.SliceStable(l.problems, func(i, j int) bool { return l.problems[i].Line < l.problems[j].Line })
		return nil, &ConfigError{File: file, Problems: l.problems}
	}
	return &c, nil
}

func (l *configLoader) bad(field string, line int, format string, args ...any) {
	l.problems = append(l.problems, Problem{Field: field, Line: line, Message: fmt.Sprintf(format, args...)})
}

// refuse records a problem with the value at field; validation problems
// at or under field are not reported again.
func (l *configLoader) refuse(field string, line int, format string, args ...any) bool {
	l.bad(field, line, format, args...)
	l.refused = append(l.refused, field)
	return false
}

func (l *configLoader) isRefused(field string) bool {
	for _, r := range l.refused {
		if field == r || r == "" || strings.HasPrefix(field, r+".") || strings.HasPrefix(field, r+"[") {
			return true
		}
	}
	return false
}

// lineOf is the line of field, or of its nearest enclosing field.
func (l *configLoader) lineOf(field string) int {
	for f := field; f != ""; {
		if line, ok := l.lines[f]; ok {
			return line
		}
		cut := max(strings.LastIndex(f, "."), strings.LastIndex(f, "["))
		if cut < 0 {
			break
		}
		f = f[:cut]
	}
	return 0
}

func (l *configLoader) setLine(field string, line int) {
	if _, ok := l.lines[field]; !ok {
		l.lines[field] = line
	}
}

// nullNode stands for a refused value: it decodes as the zero value.
func nullNode(n *yaml.Node) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line, Column: n.Column}
}

var (
	configDiskType     = reflect.TypeFor[DiskConfig]()
	configByteSizeType = reflect.TypeFor[ByteSize]()
	configDurationType = reflect.TypeFor[Duration]()
	configVolSizeType  = reflect.TypeFor[VolumeSize]()
)

// walk checks the value n of the field at path against the field's type
// t, and reports whether it fits; a value that does not is replaced by
// the caller. It takes unknown keys out of mappings.
func (l *configLoader) walk(path string, n *yaml.Node, t reflect.Type) bool {
	if l.values++; l.values == maxConfigValues {
		return l.refuse("", n.Line, "the file expands to more than %d values (aliases?): write it out plainly", maxConfigValues)
	} else if l.values > maxConfigValues {
		return false
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			return l.refuse(path, n.Line, "an alias to nothing")
		}
		n = n.Alias
	}
	if n.ShortTag() == "!!null" {
		return true // the zero value; validation says when it is needed
	}
	switch t {
	case configDiskType:
		switch n.Kind {
		case yaml.ScalarNode:
			return true
		case yaml.MappingNode:
			if !l.walkStruct(path, n, reflect.TypeFor[diskYAML]()) {
				return false
			}
			var single, multi *yaml.Node
			for i := 0; i+1 < len(n.Content); i += 2 {
				switch n.Content[i].Value {
				case "path":
					single = n.Content[i]
				case "paths":
					multi = n.Content[i]
				}
			}
			if single != nil && multi != nil {
				return l.refuse(path, single.Line, "give either path (one device) or paths (several paths to one LUN), not both")
			}
			return true
		}
		return l.refuse(path, n.Line, "want a device path, or a mapping with path or paths")
	case configByteSizeType:
		if n.Kind != yaml.ScalarNode {
			return l.refuse(path, n.Line, "want a size such as 1GiB, not %s", kindWords(n))
		}
		if _, err := parseByteSize(n.Value); err != nil {
			return l.refuse(path, n.Line, "%v", err)
		}
		return true
	case configVolSizeType:
		if n.Kind != yaml.ScalarNode {
			return l.refuse(path, n.Line, "want a size such as 1GiB, not %s", kindWords(n))
		}
		if _, err := parseVolumeSize(n.Value); err != nil {
			return l.refuse(path, n.Line, "%v", err)
		}
		return true
	case configDurationType:
		if n.Kind != yaml.ScalarNode {
			return l.refuse(path, n.Line, "want a duration such as 5s, not %s", kindWords(n))
		}
		if _, err := parseDuration(n.Value); err != nil {
			return l.refuse(path, n.Line, "%v", err)
		}
		return true
	}
	switch t.Kind() {
	case reflect.Pointer:
		// An optional section (tls:): absent or empty is nil.
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return true
		}
		return l.walk(path, n, t.Elem())
	case reflect.Struct:
		return l.walkStruct(path, n, t)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return l.refuse(path, n.Line, "want a list (lines starting with -, or [a, b]), not %s", kindWords(n))
		}
		for i, item := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			l.setLine(p, item.Line)
			if !l.walk(p, item, t.Elem()) {
				n.Content[i] = nullNode(item)
			}
		}
		return true
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return l.refuse(path, n.Line, "want a mapping (key: value), not %s", kindWords(n))
		}
		seen := map[string]int{}
		keep := n.Content[:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			if first, dup := seen[k.Value]; dup {
				l.bad(p, k.Line, "given twice (first at line %d): keep one", first)
				continue
			}
			seen[k.Value] = k.Line
			l.setLine(p, k.Line)
			if !l.walk(p, val, t.Elem()) {
				val = nullNode(val)
			}
			keep = append(keep, k, val)
		}
		n.Content = keep
		return true
	}
	if n.Kind != yaml.ScalarNode {
		return l.refuse(path, n.Line, "want %s, not %s", valueWords(t), kindWords(n))
	}
	if err := n.Decode(reflect.New(t).Interface()); err != nil {
		return l.refuse(path, n.Line, "%q: want %s", n.Value, valueWords(t))
	}
	return true
}

// walkStruct checks a mapping against struct type t: every key must be
// one of t's yaml keys; an unknown one is named with the nearest valid
// key, and taken out.
func (l *configLoader) walkStruct(path string, n *yaml.Node, t reflect.Type) bool {
	if n.Kind != yaml.MappingNode {
		return l.refuse(path, n.Line, "want a mapping (key: value lines), not %s", kindWords(n))
	}
	fields := yamlFields(t)
	given := map[string]bool{}
	for i := 0; i < len(n.Content); i += 2 {
		given[n.Content[i].Value] = true
	}
	seen := map[string]int{}
	keep := n.Content[:0]
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		p := join(path, k.Value)
		ft, known := fields[k.Value]
		switch first, dup := seen[k.Value]; {
		case k.Kind != yaml.ScalarNode:
			l.bad(path, k.Line, "a key must be a plain word, not %s", kindWords(k))
			continue
		case !known:
			msg, meant := unknownKey(k.Value, fields)
			l.bad(p, k.Line, "%s", msg)
			if meant != "" && !given[meant] {
				// The key meant is missing only because of the slip: one
				// line says it.
				l.refused = append(l.refused, join(path, meant))
			}
			continue
		case dup:
			l.bad(p, k.Line, "given twice (first at line %d): keep one", first)
			continue
		}
		seen[k.Value] = k.Line
		l.setLine(p, k.Line)
		if !l.walk(p, val, ft) {
			val = nullNode(val)
		}
		keep = append(keep, k, val)
	}
	n.Content = keep
	return true
}

// yamlFields maps the yaml keys of struct type t (inline structs
// included) to their field types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(","+opts+",", ",inline,") && f.Type.Kind() == reflect.Struct {
			for k, v := range yamlFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

// unknownKey says a key is not valid here, and which one was likely
// meant: the valid key nearest by edit distance, when near enough; else
// every valid key. meant is the key suggested, if any.
func unknownKey(key string, fields map[string]reflect.Type) (msg, meant string) {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if best, ok := nearestKey(key, keys); ok {
		return fmt.Sprintf("unknown key; did you mean %q?", best), best
	}
	return "unknown key; valid keys here: " + strings.Join(keys, ", "), ""
}

// nearestKey returns the key of keys (sorted) nearest to s by edit
// distance (case and - versus _ do not count), if it is near enough to
// be a slip: at most a third of s's length, and at least one edit.
func nearestKey(s string, keys []string) (string, bool) {
	norm := func(x string) string { return strings.ReplaceAll(strings.ToLower(x), "-", "_") }
	best, bestD := "", -1
	for _, k := range keys {
		if d := editDistance(norm(s), norm(k)); bestD < 0 || d < bestD {
			best, bestD = k, d
		}
	}
	return best, bestD >= 0 && bestD <= max(1, len(s)/3)
}

// editDistance is the optimal-string-alignment distance of a and b:
// insertions, deletions, substitutions and swaps of neighbours.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// kindWords describes what a node holds, for messages.
func kindWords(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	}
	return "this"
}

// valueWords describes what a field of type t takes, for messages.
func valueWords(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number, 0 or more"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a text value"
	}
	return "a " + t.Kind().String()
}

// join appends a key to a field path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
