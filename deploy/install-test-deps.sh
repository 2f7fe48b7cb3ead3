#!/usr/bin/env bash
# Installs the tools the test suite, the linters and the benchmark need:
# NBD clients and servers (libnbd-bin, python3-libnbd, qemu-utils, fio, nbdkit),
# FUSE and loop tooling (fuse3, e2fsprogs, xfsprogs, util-linux), network namespaces
# for partition tests (iproute2), perf for the benchmark's syscall counts
# (linux-perf), staticcheck, govulncheck and csi-sanity (cmd/replcsi's conformance test).
#
# Idempotent: apt is skipped when every tool is already present, and
# staticcheck and govulncheck are skipped when the pinned version is
# already installed.
# The apt step needs root (CI runs this as root).
set -euo pipefail

STATICCHECK_VERSION=0.8.2
GOVULNCHECK_VERSION=1.9.0
CSI_SANITY_VERSION=5.6.0
APT_PACKAGES=(libnbd-bin python3-libnbd qemu-utils fio nbdkit fuse3 e2fsprogs util-linux iproute2)
# One command per package (or the python module for python3-libnbd).
TOOLS=(nbdinfo nbdcopy nbdfuse nbdsh qemu-io qemu-img qemu-nbd fio nbdkit fusermount3
       mkfs.ext4 e2fsck losetup ip)
# promtool (Debian package prometheus) lints /metrics and deploy/alerts.yaml.
APT_PACKAGES+=(prometheus)
TOOLS+=(promtool)
# systemd-analyze verifies the unit the .deb installs (deploy/deb_test.go).
APT_PACKAGES+=(systemd)
TOOLS+=(systemd-analyze)
# xfsprogs: replctl mount --mkfs --fstype xfs is tested (internal/volmount), and
# replcsi grows a mounted xfs (xfs_growfs, cmd/replcsi).
APT_PACKAGES+=(xfsprogs)
TOOLS+=(mkfs.xfs)
# chromium: the status page's end-to-end test drives it headless (go-rod,
# never a downloaded browser).
APT_PACKAGES+=(chromium)
TOOLS+=(chromium)
# linux-perf: make bench counts each server process's system calls per IO
# (perf stat -e raw_syscalls:sys_enter; cmd/replbench/cost.go).
APT_PACKAGES+=(linux-perf)
TOOLS+=(perf)

missing=()
for t in "${TOOLS[@]}"; do
	if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$t" >/dev/null 2>&1; then
		missing+=("$t")
	fi
done
if ! /usr/bin/python3 -c 'import nbd' >/dev/null 2>&1; then
	missing+=("python3:nbd")
fi

if ((${#missing[@]} == 0)); then
	echo "install-test-deps: all test tools present, skipping apt"
else
	echo "install-test-deps: missing ${missing[*]}; installing ${APT_PACKAGES[*]}"
	SUDO=()
	if [[ $(id -u) -ne 0 ]]; then
		if command -v sudo >/dev/null 2>&1; then
			SUDO=(sudo -n)
		else
			echo "install-test-deps: need root to apt-get install ${APT_PACKAGES[*]}" >&2
			exit 1
		fi
	fi
	export DEBIAN_FRONTEND=noninteractive
	"${SUDO[@]}" apt-get update
	"${SUDO[@]}" apt-get install -y --no-install-recommends "${APT_PACKAGES[@]}"
fi

GOBIN_DIR=$(go env GOBIN)
[[ -n "$GOBIN_DIR" ]] || GOBIN_DIR="$(go env GOPATH)/bin"
# A tool built by another Go than the one that runs the build may not read
# its packages: each is installed again when the Go differs.
builtWith() { go version "$1" 2>/dev/null | awk '{print $2}'; }
goVersion=$(go env GOVERSION)
if "$GOBIN_DIR/staticcheck" -version 2>/dev/null | grep -qF "($STATICCHECK_VERSION)" && [[ $(builtWith "$GOBIN_DIR/staticcheck") == "$goVersion" ]]; then
	echo "install-test-deps: staticcheck $STATICCHECK_VERSION present"
else
	echo "install-test-deps: installing staticcheck v$STATICCHECK_VERSION into $GOBIN_DIR"
	go install "honnef.co/go/tools/cmd/staticcheck@v$STATICCHECK_VERSION"
fi
if "$GOBIN_DIR/govulncheck" -version 2>/dev/null | grep -qF "govulncheck@v$GOVULNCHECK_VERSION" && [[ $(builtWith "$GOBIN_DIR/govulncheck") == "$goVersion" ]]; then
	echo "install-test-deps: govulncheck $GOVULNCHECK_VERSION present"
else
	echo "install-test-deps: installing govulncheck v$GOVULNCHECK_VERSION into $GOBIN_DIR"
	go install "golang.org/x/vuln/cmd/govulncheck@v$GOVULNCHECK_VERSION"
fi
# csi-sanity (kubernetes-csi/csi-test) runs CSI's conformance suite against
# replcsi (cmd/replcsi/sanity_e2e_test.go); its module version is read back
# from the binary.
if go version -m "$GOBIN_DIR/csi-sanity" 2>/dev/null | grep -qE "^[[:space:]]+mod[[:space:]]+github.com/kubernetes-csi/csi-test/v5[[:space:]]+v$CSI_SANITY_VERSION[[:space:]]" && [[ $(builtWith "$GOBIN_DIR/csi-sanity") == "$goVersion" ]]; then
	echo "install-test-deps: csi-sanity $CSI_SANITY_VERSION present"
else
	echo "install-test-deps: installing csi-sanity v$CSI_SANITY_VERSION into $GOBIN_DIR"
	go install "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@v$CSI_SANITY_VERSION"
fi
