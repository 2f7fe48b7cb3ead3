package lockorder

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestEveryMutexIsChecked pins that every mutex of the module's non-test
// code is this package's, so that a build with the deadlock tag checks
// the order of every one: a sync.Mutex or sync.RWMutex named anywhere but
// in this package's lock.go is reported with its place.
func TestEveryMutexIsChecked(t *testing.T) {
	root := filepath.Join("..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module's root is not two levels up: %v", err)
	}
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		if rel, _ := filepath.Rel(root, path); rel == filepath.Join("internal", "lockorder", "lock.go") {
			return nil
		}
		files++
		for _, place := range syncMutexes(t, path) {
			t.Errorf("%s declares a %s: use internal/lockorder's, and write its place in the package's lock order (doc.go)", place.where, place.what)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("only %d Go files found under %s: update this test", files, root)
	}
}

type mutexUse struct{ where, what string }

// syncMutexes returns where the file names sync.Mutex or sync.RWMutex,
// under whatever name it imports package sync.
func syncMutexes(t *testing.T, path string) []mutexUse {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	syncName := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == "sync" {
			syncName = "sync"
			if imp.Name != nil {
				syncName = imp.Name.Name
			}
		}
	}
	if syncName == "" {
		return nil
	}
	var uses []mutexUse
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && x.Name == syncName && (sel.Sel.Name == "Mutex" || sel.Sel.Name == "RWMutex") {
			uses = append(uses, mutexUse{fset.Position(sel.Pos()).String(), "sync." + sel.Sel.Name})
		}
		return true
	})
	return uses
}
