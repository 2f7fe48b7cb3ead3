# replvol developer entry points. `make test` is what CI runs (.ci/run).
#
# Every target builds and tests with go1.27.3, which the go command fetches
# once from the Go module proxy (76 MB): Go 1.26.8's standard library has
# denial-of-service vulnerabilities our control port reaches (docs/development.md, "Known
# vulnerabilities"), and its fuzz coordinator can fail a target that found
# nothing (go.dev/issue/75804). The code still builds with Go 1.26
# (go.mod); GOTOOLCHAIN=local uses the Go on the PATH.
export GOTOOLCHAIN ?= go1.27.3
GO          ?= go
GOBIN_DIR   := $(or $(shell $(GO) env GOBIN),$(shell $(GO) env GOPATH)/bin)
STATICCHECK ?= $(GOBIN_DIR)/staticcheck
GOVULNCHECK ?= $(GOBIN_DIR)/govulncheck
FUZZTIME    ?= 20s
# How long a worker may minimise an input that found new coverage: short,
# so that a short run spends its time fuzzing (a failing input is still
# written, less minimal).
FUZZMINIMIZETIME ?= 1s
# What CI gives each fuzz target (make test). Enough for a smoke run: a
# target's whole corpus (its seeds and testdata/fuzz/, which the suite
# also runs, under -race) gathers its baseline coverage within the first
# second, even on a clean checkout, and the rest is fuzzing; make fuzz
# (FUZZTIME) is the longer run.
CI_FUZZTIME ?= 5s

.PHONY: all test test-locks fmt-check vet lint fuzz mutants bench demo deps vuln build install deb static

all: test

deps:
	./deploy/install-test-deps.sh

# gofmt check + vet (with and without the deadlock tag) + the whole suite
# with the race detector (unit, integration, e2e) and every mutex checked
# for lock-order inversions (the deadlock tag: make test-locks), then the
# tests that need the ordinary mutex ($(UNCHECKED_TESTS)), then every fuzz
# target for $(CI_FUZZTIME). $(TEST_PKGS_AT_ONCE) packages' tests run at
# once (go test -p), the packages of $(LONG_TEST_PKGS) first; the tests
# that spend their time waiting for a cluster or its tools, and time
# nothing of their own (e2eBeside in cmd/replctl, beside in node), run
# $(BESIDE_AT_ONCE) at a time (-parallel), after their package's other tests.
test: deps fmt-check vet
	@start=$$(date +%s); set -x; $(GO) test -race -tags deadlock -count=1 -p $(TEST_PKGS_AT_ONCE) -parallel $(BESIDE_AT_ONCE) -timeout 20m $(LONG_TEST_PKGS) ./... && \
		$(GO) test -race -count=1 $(UNCHECKED_TESTS) && \
		{ set +x; } 2>/dev/null && echo "make test: the suite took $$(( $$(date +%s) - start )) s"
	@start=$$(date +%s); $(MAKE) fuzz FUZZTIME=$(CI_FUZZTIME) && \
		echo "make test: fuzzing took $$(( $$(date +%s) - start )) s"

# The suite's packages spend most of their time waiting (for clusters,
# restarts, failovers, tools), not on the CPU: TEST_PKGS_AT_ONCE packages
# run at once on CI's two cores. go test starts packages in the order it
# is given them (and runs each once), so the longest are named first: one
# started last would end the suite alone. Each waiting package runs
# BESIDE_AT_ONCE of its beside tests at a time (four gained nothing over
# three in a loaded run: each test took longer).
TEST_PKGS_AT_ONCE ?= 3
BESIDE_AT_ONCE    ?= 3
LONG_TEST_PKGS    ?= ./cmd/replctl ./node ./deploy ./node/sim ./metadata ./cmd/replcsi ./transport/nbd ./node/cluster ./internal/volmount

# The tests left out of the deadlock build, whose mutexes allocate as they
# record each lock: a zero-allocation check (their files are !deadlock).
UNCHECKED_TESTS ?= -run '^TestPooledGetAndPutAllocateNothing$$' ./transport/nbd/

# The lock-order check alone: every package's tests with every mutex of the
# process internal/lockorder's go-deadlock one (the deadlock build tag), which
# records the order in which each goroutine takes them and fails the test
# binary at the first inversion, printing both orders' stacks. Each
# package's order is in its doc.go. make test runs the suite this way;
# LOCKPKGS=./node/ narrows it.
LOCKPKGS ?= ./...
test-locks:
	$(GO) test -race -count=1 -tags deadlock -timeout 20m $(LOCKPKGS)

fmt-check:
	@out=$$(gofmt -l .); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	$(GO) vet -tags deadlock ./...

lint: fmt-check vet
	@test -x "$(STATICCHECK)" || { echo "staticcheck missing: run ./deploy/install-test-deps.sh"; exit 1; }
	$(STATICCHECK) ./...

# Runs every Fuzz target of every package (internal/ too) for $(FUZZTIME)
# each, all of them even after one fails, and fails if one did. go test
# writes an input that fails to the package's testdata/fuzz/TARGET/ (never
# cleaned here), and prints it, so that it can be committed from a CI log:
# it then stays in the corpus and every go test runs it. FUZZDIRS=./replication
# fuzzes only the packages named.
#
# Each package's fuzzing test binary (coverage-instrumented, as go test
# -fuzz builds it) is built once and runs each of its targets, from the
# package's directory as go test runs it, with go test's own cache of
# interesting inputs (-test.fuzzcachedir): one go test -fuzz per target
# would link the binary again for each, and go test -list would build the
# package a third way. FUZZCACHE is where go test keeps them.
FUZZCACHE ?= $(shell $(GO) env GOCACHE)/fuzz
fuzz:
	@failed=""; bins=$$(mktemp -d) || exit 1; trap 'rm -rf "$$bins"' EXIT; \
	cache='$(FUZZCACHE)'; \
	for dir in $${FUZZDIRS:-$$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u)}; do \
		pkg=$$($(GO) list $$dir) && bin="$$bins/$$(echo "$$pkg" | tr / _).test" && \
		$(GO) test -c -fuzz . -o "$$bin" $$dir && \
		targets=$$(cd $$dir && "$$bin" -test.list '^Fuzz') || { failed="$$failed $$dir"; continue; }; \
		for f in $$(echo "$$targets" | grep '^Fuzz'); do \
			echo "== $$dir $$f ($(FUZZTIME))"; \
			(cd $$dir && "$$bin" -test.paniconexit0 -test.run '^$$' -test.fuzz "^$$f$$" -test.fuzztime $(FUZZTIME) \
				-test.fuzzminimizetime $(FUZZMINIMIZETIME) -test.fuzzcachedir "$$cache/$$pkg") || failed="$$failed $$dir:$$f"; \
		done; \
	done; \
	if [ -n "$$failed" ]; then \
		echo "fuzz: FAILED:$$failed"; \
		for f in $$(git ls-files --others --exclude-standard -- '*testdata/fuzz/*' 2>/dev/null); do \
			echo "--- new failing input $$f (commit it: it stays in the corpus):"; cat "$$f"; \
		done; \
		exit 1; \
	fi

# Plants, one at a time, each fault of internal/mutants/mutations.go in the
# production code (a go test -overlay: the tree is not touched), runs the
# simulation (TestSim, $(MUTANT_SEEDS) seeds) against it and prints which
# it caught, with the invariant, seed, step and replay command, and which
# it MISSED. It fails when one is missed or no longer applies (the code it
# patches changed), and stops when the simulation fails with no mutation.
# MUTANTSFLAGS='-only NAME' runs one; go run ./internal/mutants -list
# lists them.
MUTANT_SEEDS ?= 1000
mutants:
	$(GO) run ./internal/mutants -seeds $(MUTANT_SEEDS) $(MUTANTSFLAGS)

# Reports the known vulnerabilities (govulncheck) that the code reaches,
# with the database built offline from the Go module proxy
# (deploy/vulncheck.sh); docs/development.md, "Known vulnerabilities", lists what it
# found and why each does or does not apply. VULNFLAGS="-show verbose"
# also lists those the code does not call.
vuln:
	GOVULNCHECK=$(GOVULNCHECK) ./deploy/vulncheck.sh $(VULNFLAGS)

# One run: fio through NBD against replvol as users run it (two replnode
# processes), the replvol demo, nbdkit, a QEMU quorum mirror and the floor
# (a minimal replicated write in Go), with each server process's CPU,
# syscalls and context switches per IO (every target's files in the same
# page-cache state) and issue 31's goals, a fresh sparse volume,
# read balancing, failover and switchover times (10 runs each;
# BENCHFLAGS=-failover-runs=0 skips them), the idle cost of 1,000 volumes,
# then the multipath figures (path choice cost, throttled paths, path loss).
# It writes the book, $(BOOK) and the plot beside it (.svg): the date, the
# machine, issue 19's targets with the machine's limits, every table, and
# the multipath figures appended. An ad-hoc `go run ./cmd/replbench` writes
# no book unless given --book.
BOOK ?= docs/perf.md
bench:
	$(GO) run ./cmd/replbench --book $(BOOK) $(BENCHFLAGS)
	@echo
	@echo "multipath (each path throttled to 100 MB/s; x-capacity = share of the paths' total bandwidth delivered):"
	$(GO) test -run '^$$' -bench . -benchmem ./multipath/ | grep -E '^(Benchmark|ok)' | tee $(BOOK).multipath
	@{ printf '\n## Multipath\n\nmultipath'"'"'s Go benchmark (each path throttled to 100 MB/s; x-capacity: the share of the paths'"'"' total bandwidth delivered):\n\n```text\n'; \
		cat $(BOOK).multipath; printf '```\n'; } >>$(BOOK); rm -f $(BOOK).multipath

demo:
	$(GO) run ./cmd/replctl demo $(DEMOFLAGS)

# --- Building, installing, packaging ---------------------------------------
#
# make build     bin/replnode and bin/replctl (static: CGO_ENABLED=0), their
#                man pages (replctl's generated from its commands, replnode's
#                deploy/man/replnode.8) and replctl's shell completions
# make install   all of it under $(DESTDIR)$(PREFIX) (default /usr/local),
#                the unit with ExecStart pointing at $(BINDIR)/replnode
# make deb       build/replvol_VERSION_ARCH.deb with nfpm $(NFPM_VERSION)
#
# The release the binaries print (replctl --version), the nodes' status
# shows and the .deb takes comes from the build: go build stamps the
# module's version from the checkout's tags and commit (a tag vX.Y.Z is
# 1.4.0; a commit past a tag or with none 0.0.0~git20261205134441.7d6bd45,
# +dirty for uncommitted changes; internal/buildinfo). VERSION=1.4.0 sets
# it instead, for a build outside a git checkout.
VERSION     ?=
PREFIX      ?= /usr/local
BINDIR      ?= $(PREFIX)/bin
MANDIR      ?= $(PREFIX)/share/man
DOCDIR      ?= $(PREFIX)/share/doc/replvol
# systemd reads /usr/local/lib/systemd/system and /lib/systemd/system alike.
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR  ?= /etc
STATEDIR    ?= /var/lib/replvol
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR  ?= $(PREFIX)/share/zsh/site-functions
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d
BUILD       ?= build
# -buildvcs=auto: stamp the commit even where GOFLAGS turns it off.
GOFLAGS_BUILD ?= -trimpath -buildvcs=auto
LDFLAGS     ?= -s -w $(if $(VERSION),-X main.version=$(VERSION))
# The packaging tool, pinned; the go command builds it (the module proxy
# serves it) without making it a dependency of the project's packages.
NFPM_VERSION ?= v2.45.2
NFPM        ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION)
DEB_ARCH    ?= $(shell $(GO) env GOARCH)

static:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -ldflags '$(LDFLAGS)' -o $(BUILD)/bin/ ./cmd/replnode ./cmd/replctl ./cmd/replcsi

build: static
	rm -rf $(BUILD)/man $(BUILD)/completion
	$(BUILD)/bin/replctl man --dir $(BUILD)/man/man1
	mkdir -p $(BUILD)/man/man8 $(BUILD)/completion
	cp deploy/man/replnode.8 $(BUILD)/man/man8/
	gzip -9nf $(BUILD)/man/man1/*.1 $(BUILD)/man/man8/*.8
	$(BUILD)/bin/replctl completion bash >$(BUILD)/completion/replctl.bash
	$(BUILD)/bin/replctl completion zsh >$(BUILD)/completion/_replctl
	$(BUILD)/bin/replctl completion fish >$(BUILD)/completion/replctl.fish

install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man8 \
		$(DESTDIR)$(DOCDIR) $(DESTDIR)$(SYSCONFDIR)/replvol \
		$(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR)
	install -d -m 0700 $(DESTDIR)$(STATEDIR)
	install -m 0755 $(BUILD)/bin/replnode $(BUILD)/bin/replctl $(BUILD)/bin/replcsi $(DESTDIR)$(BINDIR)/
	sed -e 's|/usr/local/bin/replnode|$(BINDIR)/replnode|' \
		-e 's|/usr/share/doc/replvol/|$(DOCDIR)/|g' \
		-e 's|/etc/replvol/|$(SYSCONFDIR)/replvol/|g' \
		deploy/replnode.service >$(DESTDIR)$(UNITDIR)/replnode.service
	sed -e 's|/usr/local/bin/replctl|$(BINDIR)/replctl|g' \
		-e 's|/usr/share/doc/replvol/|$(DOCDIR)/|g' \
		-e 's|/etc/replvol/|$(SYSCONFDIR)/replvol/|g' \
		-e 's|/var/lib/replvol/|$(STATEDIR)/|g' \
		deploy/replvol-mount@.service >'$(DESTDIR)$(UNITDIR)/replvol-mount@.service'
	chmod 0644 $(DESTDIR)$(UNITDIR)/replnode.service '$(DESTDIR)$(UNITDIR)/replvol-mount@.service'
	install -m 0644 $(BUILD)/man/man1/*.1.gz $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 $(BUILD)/man/man8/*.8.gz $(DESTDIR)$(MANDIR)/man8/
	install -d $(DESTDIR)$(DOCDIR)/docs
	install -m 0644 README.md CHANGELOG.md deploy/cluster.example.yaml deploy/alerts.yaml $(DESTDIR)$(DOCDIR)/
	install -m 0644 docs/*.md docs/*.svg $(DESTDIR)$(DOCDIR)/docs/
	install -m 0644 deploy/cluster.example.yaml $(DESTDIR)$(SYSCONFDIR)/replvol/cluster.example.yaml
	install -m 0644 $(BUILD)/completion/replctl.bash $(DESTDIR)$(BASHCOMPDIR)/replctl
	install -m 0644 $(BUILD)/completion/_replctl $(DESTDIR)$(ZSHCOMPDIR)/_replctl
	install -m 0644 $(BUILD)/completion/replctl.fish $(DESTDIR)$(FISHCOMPDIR)/replctl.fish

# The .deb: what make install puts under /usr, the unit in
# /lib/systemd/system, the example config a conffile (deploy/nfpm.yaml).
deb:
	rm -rf $(BUILD)/deb-root
	$(MAKE) install DESTDIR=$(abspath $(BUILD))/deb-root PREFIX=/usr UNITDIR=/lib/systemd/system \
		ZSHCOMPDIR=/usr/share/zsh/vendor-completions
	DEB_VERSION="$$($(BUILD)/bin/replctl version --release)" DEB_ARCH='$(DEB_ARCH)' DEB_ROOT='$(abspath $(BUILD))/deb-root' $(NFPM) package \
		--config deploy/nfpm.yaml --packager deb --target $(BUILD)/
