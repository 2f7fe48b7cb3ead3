// Package pki is the cluster's own certificate authority and the identity
// a certificate carries: Init writes a CA and a certificate for every node,
// the operator and NBD clients (replctl certs init); Load reads a node's or
// the operator's; IdentityOf says whom a certificate from the CA names, and
// ServerConfig and ClientConfig build mutual TLS 1.3 configurations that
// accept only the identities asked for (AskingServerConfig lets every
// client in, and Caller then says whom a connection names). It imports nothing of the project;
// its functions may be called concurrently.
package pki
