# replvol developer entry points. `make test` is what CI runs (.ci/run).
#
# Every target builds and tests with go1.27.3, which the go command fetches
# once from the Go module proxy (76 MB): Go 1.26.8's standard library has
# denial-of-service vulnerabilities our control port reaches (README, "Known
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
# What CI gives each fuzz target (make test).
CI_FUZZTIME ?= 10s

.PHONY: all test fmt-check vet lint fuzz bench demo deps vuln

all: test

deps:
	./deploy/install-test-deps.sh

# gofmt check + vet + the whole suite with the race detector (unit, integration, e2e),
# then every fuzz target for $(CI_FUZZTIME).
test: deps fmt-check vet
	$(GO) test -race -count=1 -timeout 20m ./...
	$(MAKE) fuzz FUZZTIME=$(CI_FUZZTIME)

fmt-check:
	@out=$$(gofmt -l .); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

lint: fmt-check vet
	@test -x "$(STATICCHECK)" || { echo "staticcheck missing: run ./deploy/install-test-deps.sh"; exit 1; }
	$(STATICCHECK) ./...

# Runs every Fuzz target of every package (internal/ too) for $(FUZZTIME)
# each, all of them even after one fails, and fails if one did. go test
# writes an input that fails to the package's testdata/fuzz/TARGET/ (never
# cleaned here), and prints it, so that it can be committed from a CI log:
# it then stays in the corpus and every go test runs it. FUZZDIRS=./replication
# fuzzes only the packages named.
fuzz:
	@failed=""; \
	for dir in $${FUZZDIRS:-$$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u)}; do \
		targets=$$($(GO) test -list '^Fuzz' $$dir) || { failed="$$failed $$dir"; continue; }; \
		for f in $$(echo "$$targets" | grep '^Fuzz'); do \
			echo "== $$dir $$f ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $$dir || failed="$$failed $$dir:$$f"; \
		done; \
	done; \
	if [ -n "$$failed" ]; then \
		echo "fuzz: FAILED:$$failed"; \
		for f in $$(git ls-files --others --exclude-standard -- '*testdata/fuzz/*' 2>/dev/null); do \
			echo "--- new failing input $$f (commit it: it stays in the corpus):"; cat "$$f"; \
		done; \
		exit 1; \
	fi

# Reports the known vulnerabilities (govulncheck) that the code reaches,
# with the database built offline from the Go module proxy
# (deploy/vulncheck.sh); README "Known vulnerabilities" lists what it
# found and why each does or does not apply. VULNFLAGS="-show verbose"
# also lists those the code does not call.
vuln:
	GOVULNCHECK=$(GOVULNCHECK) ./deploy/vulncheck.sh $(VULNFLAGS)

# One run: fio through NBD against replvol, nbdkit and a QEMU quorum mirror,
# then failover and switchover times (10 runs each; BENCHFLAGS=-failover-runs=0
# skips them), then the multipath figures (path choice cost, throttled paths,
# path loss).
bench:
	$(GO) run ./cmd/replbench $(BENCHFLAGS)
	@echo
	@echo "multipath (each path throttled to 100 MB/s; x-capacity = share of the paths' total bandwidth delivered):"
	$(GO) test -run '^$$' -bench . -benchmem ./node/multipath/ | grep -E '^(Benchmark|ok)' 

demo:
	$(GO) run ./cmd/replctl demo $(DEMOFLAGS)
