// Command replctl is the operator's tool: it talks to any node's control
// API (status, primary, connect, disconnect) and runs a local two-node demo.
// One file per subcommand.
package main
