// Command mutants (make mutants) plants, one at a time, each of a list of
// small faults in the production rules and data path as a `go test
// -overlay` file, runs the simulation (`go test -run 'TestSim$' ./node/sim/
// -seeds N`) against it, and prints which the simulation caught (the
// invariant, seed and step, and how to replay it) and which it MISSED.
// An entry whose shape the simulation cannot reach names a test instead
// (Mutation.Test): CAUGHT when that test fails with the fault planted and
// passes without it. It exits non-zero when one is missed or no longer applies, and stops at
// once when the simulation fails without any mutation.
//
// A developer's tool, run from the module's root (`go run
// ./internal/mutants -list`); it links nothing of the project and changes
// no file of the tree: every patched copy is written to a temporary
// directory, removed at the end. It is not safe for concurrent use.
package main
