// Package fuzzseed keeps a fuzz target's committed seed corpus
// (testdata/fuzz/TARGET/seed-NN, in the `go test fuzz v1` format) the
// same as the seeds its test builds from the encoders. Only tests import
// it; it is safe for concurrent use.
package fuzzseed
