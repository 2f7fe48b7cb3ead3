#!/usr/bin/env bash
# Runs govulncheck (golang.org/x/vuln) on the module with the Go
# vulnerability database, without reaching vuln.go.dev: CI and the
# developers' machines reach only the Go module proxy, which serves the
# database's source as the golang.org/x/vulndb module (one OSV file per
# vulnerability, data/osv). Its own cmd/indexdb turns them into the
# database govulncheck reads with -db file://; that is done once per
# vulndb version, into the Go build cache.
#
# VULNDB_VERSION picks the database (default: the newest the proxy has);
# arguments go to govulncheck (e.g. -show verbose). Exit codes are
# govulncheck's: 3 when the code calls a vulnerable function.
set -euo pipefail
cd "$(dirname "$0")/.."

GOVULNCHECK=${GOVULNCHECK:-"$(go env GOPATH)/bin/govulncheck"}
if [[ ! -x "$GOVULNCHECK" ]]; then
	echo "vulncheck: $GOVULNCHECK missing: run ./deploy/install-test-deps.sh" >&2
	exit 1
fi
version=$(GOFLAGS= go list -m -f '{{.Version}}' "golang.org/x/vulndb@${VULNDB_VERSION:-latest}")
db="$(go env GOCACHE)/replvol-vulndb/$version"
if [[ ! -f "$db/index/db.json" ]]; then
	echo "vulncheck: building the vulnerability database from golang.org/x/vulndb@$version"
	GOFLAGS= go mod download "golang.org/x/vulndb@$version"
	src="$(go env GOMODCACHE)/golang.org/x/vulndb@$version/data/osv"
	tmp=$(mktemp -d "$(go env GOCACHE)/replvol-vulndb-XXXXXX")
	GOFLAGS= go run "golang.org/x/vulndb/cmd/indexdb@$version" -vulns "$src" -out "$tmp/db"
	mkdir -p "$(dirname "$db")"
	rm -rf "$db"
	mv "$tmp/db" "$db"
	rm -rf "$tmp"
fi
echo "vulncheck: database golang.org/x/vulndb@$version ($(ls "$db/ID" | grep -c "\.json$") vulnerabilities), $(go version)"
exec "$GOVULNCHECK" -db "file://$db" "$@" ./...
