// Package logonce remembers what was logged, so that a refusal repeated at
// every retry of a peer (a TLS handshake, a stream) is logged once per
// peer and cause, and again only after a quiet spell. It imports nothing
// of the project but internal/lockorder; a Set may be used concurrently.
//
// A Set's mutex is a leaf (internal/lockorder's): it reads its clock under
// it, nothing else.
package logonce
