// Package poll is the tests' one polling loop: Within checks a condition
// on the state of the code under test until it holds or a timeout passes.
// Tests of several packages wait through it (each through a helper of its
// own that says what it waits for and what a timeout means); production
// code never polls with it.
package poll
