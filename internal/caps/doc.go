// Package caps reads this process's effective Linux capabilities
// (/proc/self/status's CapEff), for the callers that must say, before
// the kernel refuses, which capability an operation lacks: growing a
// mounted file system (the CSI driver's NodeExpandVolume) and the tests
// that take the path only where the capability is held. It imports the
// standard library only.
package caps
