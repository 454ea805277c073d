# Buzz in Go. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO ?= go
# Wraps a command in one private PostgreSQL cluster shared by every test package.
WITH_PG := $(GO) run ./internal/dbtest/withcluster --
GENERATED := internal/db sql/schema.sql 'queries/*.gen.sql'

.PHONY: help run test generate verify lint bench build interop-deps

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

run: ## run the relay with a private PostgreSQL under .data/ (or BUZZ_DATABASE_URL)
	$(GO) run ./cmd/buzz-relay dev

build: ## build every command into bin/
	$(GO) build -o bin/ ./cmd/...

test: verify lint interop-deps ## verify generated code, lint, then run every test against real PostgreSQL
	$(WITH_PG) $(GO) test -count=1 -timeout 15m ./...

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

lint: ## gofmt and go vet
	@unformatted=$$(gofmt -l cmd internal migrations); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

interop-deps: ## install the npm client used by the interop tests (nostr-tools)
	@if [ ! -d internal/interop/js/node_modules/nostr-tools ]; then \
		cd internal/interop/js && npm ci --no-audit --no-fund --loglevel=error; fi

bench: ## run buzz-bench for ~30 s against a dev relay, plus the Go benchmarks
	$(GO) build -o bin/ ./cmd/buzz-relay ./cmd/buzz-bench
	GO='$(GO)' bash cmd/buzz-bench/bench.sh $(BENCH_FLAGS)
