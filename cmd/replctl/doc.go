// Command replctl is the operator's tool: it talks to any node's control
// API (status, events, primary, connect, disconnect, resync, verify, path,
// adjust, node) and runs a local two-node demo. One file per subcommand;
// errors.go puts failures in words, table.go lays out and colours tables.
// Client commands reach nodes only through package transport.
package main
