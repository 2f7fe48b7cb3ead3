// Package deploy holds what puts replvol on hosts: the systemd unit, the
// example cluster file, the .deb's recipe (nfpm.yaml), the Dockerfile's
// compose file and local-cluster.sh. Its Go code is tests only: they
// install the .deb into the system (as root, removing it after), run
// local-cluster.sh through a failover, and check the container files.
package deploy
