// Package nbd serves Exports to NBD clients (fixed newstyle handshake, simple replies) with many
// requests in flight per connection. It imports nothing of the project; a Server and an Export's
// methods are called from many goroutines at once.
package nbd
