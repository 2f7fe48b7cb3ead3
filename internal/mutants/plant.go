package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// errNoLongerApplies: a mutation's text is not in its file exactly once
// (the code it patches changed): the mutation must be rewritten, never run
// on unmutated code.
var errNoLongerApplies = errors.New("no longer applies")

// Site is where an edit is planted: its file and the function that holds
// the text it patched ("" at the top level of the file).
type Site struct {
	File     string
	Function string
}

func (s Site) String() string {
	if s.Function == "" {
		return s.File
	}
	return s.File + ":" + s.Function
}

// Planted is a mutation written out: the overlay file for go's -overlay
// flag, the packages it patches (import paths relative to the module, as
// "./node/volstate") and where each edit went.
type Planted struct {
	Overlay  string
	Packages []string
	Sites    []Site
}

// Where says where the mutation is planted, one site per edit, each once.
func (p Planted) Where() string {
	var out []string
	for _, s := range p.Sites {
		if w := s.String(); !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return strings.Join(out, ", ")
}

// plant writes m's patched files and the overlay that maps each real file
// (under root, the module's root) to its patched copy into dir. It
// changes no file under root. An edit whose text does not occur exactly
// once, or a patched file that does not parse, is an error that names the
// mutation and the text.
func plant(root string, m Mutation, dir string) (Planted, error) {
	if len(m.Edits) == 0 {
		return Planted{}, fmt.Errorf("mutation %s has no edits", m.Name)
	}
	var pl Planted
	patched := map[string]string{} // file -> its text so far
	var order []string
	for i, e := range m.Edits {
		if e.Find == "" || e.Find == e.Replace {
			return Planted{}, fmt.Errorf("mutation %s, edit %d in %s: it finds nothing or replaces its text with itself", m.Name, i+1, e.File)
		}
		text, ok := patched[e.File]
		if !ok {
			b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(e.File)))
			if err != nil {
				return Planted{}, fmt.Errorf("mutation %s: %w", m.Name, err)
			}
			text = string(b)
			order = append(order, e.File)
		}
		if n := strings.Count(text, e.Find); n != 1 {
			return Planted{}, fmt.Errorf("mutation %s %w: %s holds the text it patches %d times, not once (the code changed: rewrite the mutation in internal/mutants/mutations.go); it looked for:\n%s",
				m.Name, errNoLongerApplies, e.File, n, indent(e.Find))
		}
		at := strings.Index(text, e.Find)
		fn, err := enclosingFunc(e.File, text, at)
		if err != nil {
			return Planted{}, fmt.Errorf("mutation %s: %w", m.Name, err)
		}
		pl.Sites = append(pl.Sites, Site{File: e.File, Function: fn})
		patched[e.File] = text[:at] + e.Replace + text[at+len(e.Find):]
	}
	replace := map[string]string{}
	for _, file := range order {
		text := patched[file]
		if _, err := parser.ParseFile(token.NewFileSet(), file, text, parser.SkipObjectResolution); err != nil {
			return Planted{}, fmt.Errorf("mutation %s: the patched %s does not parse: %w", m.Name, file, err)
		}
		copyPath := filepath.Join(dir, "files", filepath.FromSlash(file))
		if err := os.MkdirAll(filepath.Dir(copyPath), 0o755); err != nil {
			return Planted{}, err
		}
		if err := os.WriteFile(copyPath, []byte(text), 0o644); err != nil {
			return Planted{}, err
		}
		real, err := filepath.Abs(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			return Planted{}, err
		}
		replace[real] = copyPath
		if pkg := "./" + path.Dir(file); !slices.Contains(pl.Packages, pkg) {
			pl.Packages = append(pl.Packages, pkg)
		}
	}
	b, err := json.MarshalIndent(struct{ Replace map[string]string }{replace}, "", "\t")
	if err != nil {
		return Planted{}, err
	}
	pl.Overlay = filepath.Join(dir, "overlay.json")
	return pl, os.WriteFile(pl.Overlay, b, 0o644)
}

// enclosingFunc names the function of the Go file text (named file) that
// holds the byte at offset: "Name" or "(*Recv).Name", or the package
// variable that does ("var Name"); "" when none does.
func enclosingFunc(file, text string, offset int) (string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, text, parser.SkipObjectResolution)
	if err != nil {
		return "", fmt.Errorf("%s does not parse: %w", file, err)
	}
	for _, d := range f.Decls {
		if start, end := fset.Position(d.Pos()).Offset, fset.Position(d.End()).Offset; offset < start || offset >= end {
			continue
		}
		if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.VAR {
			// A table the rules read (an order, a list): named as the
			// variable.
			for _, sp := range gd.Specs {
				vs := sp.(*ast.ValueSpec)
				if start, end := fset.Position(vs.Pos()).Offset, fset.Position(vs.End()).Offset; len(gd.Specs) == 1 || offset >= start && offset < end {
					return "var " + vs.Names[0].Name, nil
				}
			}
		}
		fd, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		if start, end := fset.Position(fd.Pos()).Offset, fset.Position(fd.End()).Offset; offset < start || offset >= end {
			continue
		}
		if fd.Recv == nil || len(fd.Recv.List) == 0 {
			return fd.Name.Name, nil
		}
		return "(" + typeName(fd.Recv.List[0].Type) + ")." + fd.Name.Name, nil
	}
	return "", nil
}

func typeName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return "*" + typeName(t.X)
	case *ast.Ident:
		return t.Name
	case *ast.IndexExpr:
		return typeName(t.X)
	case *ast.IndexListExpr:
		return typeName(t.X)
	}
	return "?"
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}
