package node

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// machineFields are the Volume fields that hold the state machine's
// state (node/volstate): st, the volstate.State itself (the role, which
// is st.Role(), the serving state, the disk state, the cause of why, the
// durable state: epoch, primary, generations; the peers' split brains,
// whether it discards, the crashed-primary mark, the operator's
// disconnect, the epochs heard of, a pending role change, the authority
// mode and the lease), the words of why, and a discard's words.
var machineFields = map[string]bool{
	"st": true, "whyText": true, "discard": true,
}

// machineWriters are the functions allowed to write them: the install of
// a step (drive.go), the commit of the durable state a step persists
// (state.go; a resize's size goes through it too, in a call on the loop),
// the install of a split brain a step found, the install hooks a step's
// caller gives it (driveOptions.install), and the constructor, which
// loads the state before the first step. The deadlock build checks that
// the install and the commit run on the volume's loop
// (TestTheVolumesStateChangesOnlyOnItsLoop).
var machineWriters = map[string]bool{
	"installLocked": true, "commitMirror": true, "noteSplitBrainLocked": true, "newVolume": true,
}

// TestOnlyTheStepsWriteTheVolumesState: no code of package node outside
// the install of a state machine step writes the volume's state (issue
// 28: the rules that are tested are the rules that run). It parses the
// package's non-test files for assignments to, deletes and clears from,
// and pointers taken to the fields above (any part of them: v.st.Serving,
// v.st.Peers[name]), and names every writer outside machineWriters.
func TestOnlyTheStepsWriteTheVolumesState(t *testing.T) {
	fset, funcs := packageFuncs(t)
	var bad []string
	for _, fn := range funcs {
		if machineWriters[fn.Name.Name] {
			continue
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			var targets []ast.Expr
			switch n := n.(type) {
			case *ast.KeyValueExpr:
				// driveOptions.install runs in the step's install.
				if id, ok := n.Key.(*ast.Ident); ok && id.Name == "install" {
					return false
				}
			case *ast.AssignStmt:
				targets = n.Lhs
			case *ast.IncDecStmt:
				targets = []ast.Expr{n.X}
			case *ast.UnaryExpr:
				// A pointer into the state would let it be written.
				if n.Op == token.AND {
					targets = []ast.Expr{n.X}
				}
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); ok && (id.Name == "delete" || id.Name == "clear") && len(n.Args) > 0 {
					targets = n.Args[:1]
				}
			}
			for _, x := range targets {
				if field, ok := volumeField(x); ok && machineFields[field] {
					bad = append(bad, fset.Position(x.Pos()).String()+" "+fn.Name.Name+" writes "+types.ExprString(x)+" (v."+field+")")
				}
			}
			return true
		})
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Fatalf("the volume's state is written outside a step's install (step the state machine instead):\n  %s", strings.Join(bad, "\n  "))
	}
}

// TestOnlyTheStepsInstallAPeersState: a peer's view (and its pulling
// flag) publishes the peer's state in the volume's state machine, so no
// code of package node outside that publication (publishPeersLocked, in
// a step's install) writes the view's replication state or stream number,
// or the flag; a view is made only from the machine's state (newPeer) or
// from the view it replaces (takeStream, which adds the stream).
func TestOnlyTheStepsInstallAPeersState(t *testing.T) {
	fset, funcs := packageFuncs(t)
	var bad []string
	for _, fn := range funcs {
		if fn.Name.Name == "publishPeersLocked" {
			continue
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for _, x := range n.Lhs {
					if sel, ok := x.(*ast.SelectorExpr); ok && (sel.Sel.Name == "state" || sel.Sel.Name == "sid") {
						bad = append(bad, fset.Position(x.Pos()).String()+" "+fn.Name.Name+" writes "+types.ExprString(x))
					}
				}
			case *ast.CallExpr:
				// pulling.Store, pulling.Swap, pulling.CompareAndSwap
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name != "Load" && strings.HasSuffix(types.ExprString(sel.X), ".pulling") && fn.Name.Name != "newPeer" {
					bad = append(bad, fset.Position(n.Pos()).String()+" "+fn.Name.Name+" writes "+types.ExprString(sel.X))
				}
			case *ast.CompositeLit:
				if id, ok := n.Type.(*ast.Ident); !ok || id.Name != "peerView" {
					return true
				}
				for _, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					key := types.ExprString(kv.Key)
					if key != "state" && key != "sid" {
						continue
					}
					switch val := types.ExprString(kv.Value); {
					case fn.Name.Name == "newPeer" && (val == "st.Repl" || val == "st.Session"):
					case fn.Name.Name == "takeStream" && val == "pv."+key:
					default:
						bad = append(bad, fset.Position(kv.Pos()).String()+" "+fn.Name.Name+" makes a view with "+key+": "+val)
					}
				}
			}
			return true
		})
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Fatalf("a peer's state is written outside a step's install (step the state machine instead: tellNews, askNews, drive):\n  %s", strings.Join(bad, "\n  "))
	}
}

// volumeField returns the Volume field x writes, through v.F, v.F[k] or
// v.F.G (v being a *Volume, named v as everywhere in package node).
func volumeField(x ast.Expr) (string, bool) {
	for {
		switch e := x.(type) {
		case *ast.IndexExpr:
			x = e.X
			continue
		case *ast.SelectorExpr:
			if id, ok := e.X.(*ast.Ident); ok && id.Name == "v" {
				return e.Sel.Name, true
			}
			x = e.X
			continue
		case *ast.ParenExpr:
			x = e.X
			continue
		}
		return "", false
	}
}

// loopCalls are the functions that step (stepLocked) on the volume's loop
// in a function the loop runs (volloop.Loop.Call, Tell or Ask) rather than
// as a drive, each with the functions it is called from, and how a
// closure given to the loop (".loop.Call(func() {...})", or Tell, or Ask)
// calls those (or it, when they are where the closure is): the
// handshake's decision, which marks the peer's bitmap on the state it
// decides on and switches the peer's writes to the stream in the same
// critical section as its step; the end of the stream from the primary,
// decided with the check that it is still the current stream; and the
// news of a peer's link and streams, told by a session's loop (which
// must not wait for a drive), asked by the link, and the restart of a
// link stopped by a refusal.
var loopCalls = map[string]loopCall{
	"decide":        {call: "p.decide", from: []string{"takeStream"}, fromCall: "p.takeStream"},
	"incomingEnded": {call: "v.incomingEnded", from: []string{"endIncoming"}, fromCall: "v.incomingEnded"},
	"takeNews":      {call: "p.takeNews", from: []string{"askNews", "resumePeers", "tellNews"}, fromCall: "p.takeNews"},
}

// loopCall is how a function of loopCalls is called (call, an
// expression as the source writes it), from which functions, and how
// those call it inside the closure given to the loop (fromCall).
type loopCall struct {
	call     string
	from     []string
	fromCall string
}

// TestTheVolumesStepsRunOnItsLoop: every step of a volume's state
// machine in package node is taken on the volume's loop, as a drive or in
// a call of loopCalls. It parses the package's non-test files for calls
// of stepLocked and volstate.Take, and names every caller that is not the
// driver itself (drive.go's volumeSteps) or one of loopCalls, called only
// as it says.
func TestTheVolumesStepsRunOnItsLoop(t *testing.T) {
	drivers := map[string]bool{"stepLocked": true, "drive": true}
	fset, funcs := packageFuncs(t)
	var bad []string
	seen := map[string]bool{}
	// callers[f] are the functions that call f, by name; inLoopCall[f]
	// counts f's calls inside a closure given to a loop's call.
	callers := map[string][]string{}
	inLoopCall := map[string]int{}
	for _, fn := range funcs {
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			callers[types.ExprString(call.Fun)] = append(callers[types.ExprString(call.Fun)], fn.Name.Name)
			if (sel.Sel.Name == "Call" || sel.Sel.Name == "Tell" || sel.Sel.Name == "Ask") && strings.HasSuffix(types.ExprString(sel.X), ".loop") && len(call.Args) == 1 {
				if lit, ok := call.Args[0].(*ast.FuncLit); ok {
					ast.Inspect(lit.Body, func(n ast.Node) bool {
						if c, ok := n.(*ast.CallExpr); ok {
							inLoopCall[types.ExprString(c.Fun)]++
						}
						return true
					})
				}
			}
			if drivers[fn.Name.Name] {
				return true
			}
			step := sel.Sel.Name
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "volstate" && step == "Take" {
				step = "volstate.Take"
			} else if step != "stepLocked" {
				return true
			}
			if _, ok := loopCalls[fn.Name.Name]; ok && step != "volstate.Take" {
				seen[fn.Name.Name] = true
				return true
			}
			bad = append(bad, fset.Position(call.Pos()).String()+" "+fn.Name.Name+" calls "+step)
			return true
		})
	}
	for fn, lc := range loopCalls {
		if c := slices.Sorted(slices.Values(callers[lc.call])); !slices.Equal(c, lc.from) {
			bad = append(bad, fmt.Sprintf("%s steps on the loop only when called from %s alone; it is called from %v", fn, lc.from, c))
		}
		if n := len(callers[lc.fromCall]); n == 0 || inLoopCall[lc.fromCall] != n {
			bad = append(bad, fmt.Sprintf("%s must be called only inside a closure given to the loop's call: %d of its %d calls are", lc.fromCall, inLoopCall[lc.fromCall], n))
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Fatalf("a step of the volume's state machine off its loop (drive it: v.drive):\n  %s", strings.Join(bad, "\n  "))
	}
	for fn := range loopCalls {
		if !seen[fn] {
			t.Errorf("%s no longer steps: take it off loopCalls", fn)
		}
	}
}

// packageFuncs parses package node's non-test files and returns its
// functions with a body, in file order.
func packageFuncs(t *testing.T) (*token.FileSet, []*ast.FuncDecl) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var funcs []*ast.FuncDecl
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Body != nil {
				funcs = append(funcs, fn)
			}
		}
	}
	return fset, funcs
}
