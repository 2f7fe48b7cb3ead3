// Package repltest holds replication streams for tests of the code that
// drives one (node, node/session): streams that hold sends back or never
// answer, to play a peer that hangs. It imports transport and replication
// only; nothing of it runs outside tests.
package repltest
