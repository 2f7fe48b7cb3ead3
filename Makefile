# replvol developer entry points. `make test` is what CI runs (.ci/run).
GO          ?= go
GOBIN_DIR   := $(or $(shell $(GO) env GOBIN),$(shell $(GO) env GOPATH)/bin)
STATICCHECK ?= $(GOBIN_DIR)/staticcheck
FUZZTIME    ?= 20s

.PHONY: all test fmt-check vet lint fuzz bench demo deps

all: test

deps:
	./deploy/install-test-deps.sh

# gofmt check + vet + the whole suite with the race detector (unit, integration, e2e).
test: deps fmt-check vet
	$(GO) test -race -count=1 -timeout 20m ./...

fmt-check:
	@out=$$(gofmt -l .); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

lint: fmt-check vet
	@test -x "$(STATICCHECK)" || { echo "staticcheck missing: run ./deploy/install-test-deps.sh"; exit 1; }
	$(STATICCHECK) ./...

# Runs every Fuzz target for $(FUZZTIME) each.
fuzz:
	@set -e; \
	for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "== $$pkg $$f"; \
			$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

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
