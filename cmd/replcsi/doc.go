// Command replcsi is replvol's CSI driver: one binary that serves CSI's identity, controller
// and node services on a unix socket (--endpoint unix:///csi/csi.sock), for a Kubernetes
// cluster's sidecars and kubelet. It talks to the replvol cluster through the control API of
// the node at --addr (with --tls-dir's operator certificate over TCP), and attaches volumes on
// its host with replctl attach --follow (--replctl). The services are in internal/csidriver;
// deploy/kubernetes holds the manifests and docs/kubernetes.md the guide.
package main
