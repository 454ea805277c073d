# Buzz in Go. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO ?= go
# Wraps a command in one private PostgreSQL cluster shared by every test package.
WITH_PG := $(GO) run ./internal/dbtest/withcluster --
GENERATED := internal/db sql/schema.sql 'queries/*.gen.sql'

# BIP-340 signatures are verified by libsecp256k1 through cgo (Debian's
# libsecp256k1-dev, which .ci/deps installs): about four times less CPU per
# event than the pure-Go verifier. The tag is on by default, not detected,
# so a machine without the library fails the build loudly instead of quietly
# running the slower verifier; `make GOTAGS= run` (or build, test) selects
# the pure-Go verifier. GOFLAGS carries the tag to every go command below,
# including the ones the test wrapper and bench.sh start.
GOTAGS ?= system_libsecp256k1
export GOFLAGS := $(strip $(GOFLAGS) $(if $(GOTAGS),-tags=$(GOTAGS)))

.PHONY: help run run-replica test generate verify lint bench bench-scale build interop-deps deps-run deps-test

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The relay is built, then run as the recipe's own process rather than
# through `go run`, which turns a relay that stopped cleanly on Ctrl-C into
# exit status 1, and make into "Error 1". A relay that fails, at start or
# while it stops, still exits non-zero and make says so.
run: deps-run ## run the relay with a private PostgreSQL under .data/ (or BUZZ_DATABASE_URL)
	$(GO) build -o bin/buzz-relay ./cmd/buzz-relay
	exec bin/buzz-relay dev

run-replica: deps-run ## like run, plus a streaming standby of the private PostgreSQL that reads route to (BUZZ_DEV_REPLICA=1)
	$(GO) build -o bin/buzz-relay ./cmd/buzz-relay
	BUZZ_DEV_REPLICA=1 exec bin/buzz-relay dev

# Test helpers under cmd/*/internal are commands too; they stay out of bin/.
build: deps-run ## build every command into bin/
	$(GO) build -o bin/ $$($(GO) list ./cmd/... | grep -v /internal/)

# Every package runs under the race detector except the interop tests: the
# go-nostr client they drive (v0.52.3) clears Relay.Connection in its writer
# goroutine while its closer reads it, a race inside that library on every
# disconnect. The relay code those tests reach runs raced in the other packages.
RACE_PACKAGES = $$($(GO) list ./... | grep -v '/internal/interop$$')

# The tests built only without the race detector (files under
# `//go:build !race`): they measure allocations and stack sizes, which the
# detector inflates. They run once more, unraced, after the raced run.
NORACE_PACKAGE = ./internal/relay/
NORACE_TESTS = TestIdleConnectionStackStaysShallow|TestLiveEventToAnIdleConnectionAllocatesNothing

test: deps-test verify lint interop-deps ## verify generated code, lint, then run every test (race detector on) against real PostgreSQL
	$(WITH_PG) $(GO) test -race -count=1 -timeout 30m $(RACE_PACKAGES)
	$(WITH_PG) $(GO) test -count=1 -timeout 15m ./internal/interop/...
	$(WITH_PG) $(GO) test -count=1 -timeout 5m -run '^($(NORACE_TESTS))$$' $(NORACE_PACKAGE)

generate: ## render query templates, dump sql/schema.sql from the migrations, run sqlc
	$(GO) run ./internal/querytmpl/render
	$(WITH_PG) $(GO) run ./internal/schemadump/dumpschema > sql/schema.sql.tmp
	mv sql/schema.sql.tmp sql/schema.sql
	$(GO) tool sqlc generate

verify: generate ## regenerate and fail if any committed generated file was stale
	@if [ -n "$$(git status --porcelain -- $(GENERATED))" ]; then \
		echo "generated files are stale; run 'make generate' and commit:"; \
		git status --porcelain -- $(GENERATED); git --no-pager diff --stat -- $(GENERATED); exit 1; \
	fi
	@echo "verify: generated files are up to date"

lint: ## gofmt and go vet (with GOTAGS, and once more without cgo or tags for the pure-Go build)
	@unformatted=$$(gofmt -l cmd internal migrations); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) vet -tags= ./...

# A fresh machine of this kind has Go and make; what else a target needs
# (gcc, libsecp256k1-dev, PostgreSQL, redis-server, Node.js) .ci/deps installs
# when it is missing (as root, with apt-get) or names and fails.
deps-run: ## install what building and running the relay needs, if missing
	@.ci/deps run

deps-test: ## install what the tests need, if missing
	@.ci/deps test

interop-deps: ## install the npm client used by the interop tests (nostr-tools)
	@if [ ! -d internal/interop/js/node_modules/nostr-tools ]; then \
		cd internal/interop/js && npm ci --no-audit --no-fund --loglevel=error; fi

bench: deps-run ## one table of every speed measure and its target, ~6 min (cmd/buzz-bench/bench.sh)
	$(GO) build -o bin/ ./cmd/buzz-relay ./cmd/buzz-bench
	GO='$(GO)' bash cmd/buzz-bench/bench.sh $(BENCH_FLAGS)

bench-scale: deps-run ## load 1,000,000 synthetic events by SQL into a throwaway dev relay; bytes per event and read shapes (cmd/buzz-bench/bench-scale.sh)
	$(GO) build -o bin/ ./cmd/buzz-relay ./cmd/buzz-bench
	bash cmd/buzz-bench/bench-scale.sh
