# keyed's Makefile. `make` or `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

BIN          := $(CURDIR)/bin
TEMPORAL     := $(BIN)/temporal
STRIPE_MOCK  := $(BIN)/stripe-mock
PROMTOOL     := $(BIN)/promtool
STATICCHECK  := $(BIN)/staticcheck
TEMPORAL_SERVER   := $(BIN)/temporal-server
TEMPORAL_SQL_TOOL := $(BIN)/temporal-sql-tool
TEMPORAL_UI       := $(BIN)/temporal-ui
CHROMIUM     := /usr/bin/chromium
TEMPORAL_CLI_VERSION := v1.5.1
STRIPE_MOCK_VERSION  := v0.203.0
STATICCHECK_VERSION  := v0.8.2
export DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
export KEYED_TEMPORAL_BIN ?= $(TEMPORAL)
export KEYED_STRIPE_MOCK_BIN ?= $(STRIPE_MOCK)
GO_TEST_FLAGS ?= -race -count=1 -timeout 20m -p 2 -parallel 2
# A count, not a duration: a -fuzztime duration races the fuzz coordinator's
# deadline and can fail a clean run with "context deadline exceeded" on a busy
# machine (golang/go#75804). 50000 runs take about five seconds here.
FUZZ_TIME ?= 50000x

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: test
test: postgres tools ## Run go vet, staticcheck and a gofmt check, every test against real Postgres (and, from the pipeline on, a Temporal dev server), then fuzz keys briefly.
	go vet ./...
	$(STATICCHECK) ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	go test $(GO_TEST_FLAGS) ./...
	go test -run '^$$' -fuzz FuzzParseKey -fuzztime $(FUZZ_TIME) ./effects

.PHONY: lint
lint: $(STATICCHECK) ## Run staticcheck over every package.
	$(STATICCHECK) ./...

.PHONY: test-faults
test-faults: postgres tools ## Run the fault-injection end-to-end test alone (kills, terminated backends, a Postgres restart, lost responses) and print its figures.
	go test -count=1 -timeout 15m -v -run '^TestFaults$$' ./tests

.PHONY: test-cluster
test-cluster: postgres tools ## Run the fault test's shape on a 2-node Temporal cluster (Postgres persistence) with 3 worker processes (240 orders, 116 refunds, worker and Temporal node SIGKILLs, a Postgres restart), then a 1000-order burst against fakes that 429 above 25/s, unbounded and with the provider rate limits; print their figures (go test ./... runs only internal/tempcluster's short node-kill test).
	go test -tags cluster -count=1 -timeout 30m -v -run '^(TestClusterFaults|TestProviderRateLimitBurst)$$' ./tests

.PHONY: demo
demo: postgres tools build ## Run the order pipeline end to end: dev server + Web UI, worker, fakes, orders, duplicate starts (KEEP=1 keeps it up and writes .demo/env for bin/starter).
	bin/demo $(if $(KEEP),-keep)

.PHONY: cluster
cluster: postgres tools ## Run a self-hosted Temporal cluster until Ctrl-C: 2 temporal-server processes on Postgres persistence + SQL visibility (a fresh database, dropped on exit), keyed's search attributes, a load balancer on :7233 and the Web UI on :8233 (NODES=, PORT=, UI_PORT= to change).
	go run ./cmd/cluster -nodes $(or $(NODES),2) -port $(or $(PORT),7233) -ui-port $(or $(UI_PORT),8233)

.PHONY: build
build: ## Build the worker, starter, fakes and demo binaries into bin/.
	go build -o bin/ ./cmd/...

.PHONY: bench
bench: postgres ## Benchmark claim+complete, partitioned beside unpartitioned and raw pgx, and the claim beside raw pgx's statements in the same leaf, at 1, 8 and 32 connections, and at 2, 6 and 16 leaves per lifetime; the claim statement's lock and guard priced apart on one connection; List beside the starts_with read it replaced; Get of a missing key beside the look-up it replaced; effect storage per million records and retirement rate, before and after migration 0009 and partitioned.
	go test -run '^$$' -bench 'ClaimComplete$$' -benchtime 5000x -count 3 ./effects
	go test -run '^$$' -bench ClaimCompleteLeaf -benchtime 5000x -count 3 ./effects
	go test -run '^$$' -bench ClaimStatementSplit -benchtime 5000x -count 3 ./effects
	go test -run '^$$' -bench LeavesPerLifetime -benchtime 4000x -count 3 ./effects
	go test -run '^$$' -bench 'List$$' -benchtime 3000x -count 2 ./effects
	go test -run '^$$' -bench GetMiss -benchtime 3000x -count 2 ./effects
	go test -run '^$$' -bench EffectStorage -benchtime 1x -timeout 30m ./effects

.PHONY: bench-retire
bench-retire: postgres ## Retire 10 million expired effect records by DELETE and by dropping leaves, side by side: time, WAL bytes, claim p99 idle and meanwhile (RETIRE_ROWS=... to change).
	RETIRE_ROWS=$${RETIRE_ROWS:-10000000} go test -run '^$$' -bench Retire -benchtime 1x -timeout 60m ./effects

.PHONY: bench-api
bench-api: postgres ## Benchmark POST /v1/orders with fresh and replayed Idempotency-Keys, side by side.
	go test -run '^$$' -bench CreateOrder -benchtime 3s -count 3 ./api

.PHONY: bench-pipeline
bench-pipeline: postgres tools ## Run keyed's shipped worker binary and a bare-k8 worker (3 no-op activities, keyed's options) in their own processes on one dev server at C=20 and 50: open loop (300 started at once), closed loop and relay-started, 4 alternating rounds; print wf/s, p50/p99/max, CPU per workflow per process and history figures.
	go test -run '^$$' -bench PipelineProcesses -benchtime 1x -timeout 60m ./tests

.PHONY: bench-storm
bench-storm: postgres tools ## Storm of 1000 concurrent starts over 10 orders through workflows.Start and through the HTTP API (with the relay) beside the bare SDK (USE_EXISTING) on one dev server; check 10 runs and 10 charges, print p50/p99 and the p99 ratio.
	go test -run '^$$' -bench Storm -benchtime 1x -timeout 20m ./tests

.PHONY: bench-enqueue
bench-enqueue: postgres ## Commit orders with their outbox rows from 8 and 32 concurrent transactions, every enqueue notifying beside one per NotifyWindow: orders/s and p99.
	go test -run '^$$' -bench Enqueue -benchtime 4000x -count 3 ./outbox

.PHONY: bench-prune
bench-prune: postgres ## Prune 500 000 sent outbox rows (PRUNE_ROWS=... to change) and 300 000 expired unpartitioned effect records, the locking DELETEs Prune sent before beside the shipped ones, alternating: rows/s and WAL.
	go test -run '^$$' -bench 'Prune$$' -benchtime 3x -timeout 20m ./outbox
	go test -run '^$$' -bench PruneLegacy -benchtime 3x -timeout 20m ./effects

.PHONY: bench-relay
bench-relay: postgres tools ## Measure outbox commit -> run start latency (p50/p99) at 50 and 200 orders/s on a dev server, beside direct starts; then a relay draining 2000 rows, marking with its claims beside marking each row: rows/s, statements and CPU per row.
	go test -run '^$$' -bench 'RelayCommitToStart|RelayDrain' -benchtime 1x -count 3 -timeout 20m ./outbox

.PHONY: bench-fair
bench-fair: postgres tools ## Measure tenant B's commit -> run start latency (p50/p99) while tenant A's 10 000 orders flood the outbox, the old FIFO claim beside the fair one, on a dev server.
	go test -run '^$$' -bench RelayFairness -benchtime 1x -count 1 -timeout 60m ./outbox

.PHONY: bench-settle
bench-settle: postgres tools ## Measure the settler: 20 receipts lose their answers while SendGrid's look-up is down for KEYED_BENCH_OUTAGE (1m); report waits settled by keyed, left for a person, duplicates at the fake and recovery-to-done p50/p99.
	go test -run '^$$' -bench SettleAfterLookupOutage -benchtime 1x -timeout 40m ./tests

.PHONY: bench-cluster
bench-cluster: postgres tools ## On the dev server and a 2-node Temporal cluster: 200 orders, 20 at a time, through 1 and 3 worker processes (orders/s, start-to-paid p50/p99); tenant B's p50/p99 while tenant A floods 400 orders, Temporal's fairness off and on.
	go test -tags cluster -run '^$$' -bench 'ClusterThroughput|TenantFairness' -benchtime 1x -timeout 60m ./tests

.PHONY: fuzz
fuzz: ## Fuzz key parsing for about a minute, 600000 runs (FUZZ_TIME=... to change).
	go test -run '^$$' -fuzz FuzzParseKey -fuzztime $(if $(filter 50000x,$(FUZZ_TIME)),600000x,$(FUZZ_TIME)) ./effects

.PHONY: postgres
postgres: ## Make sure PostgreSQL runs on 127.0.0.1:5432 (starts or installs it).
	@scripts/ensure-postgres

.PHONY: tools
tools: $(TEMPORAL) $(TEMPORAL_SERVER) $(TEMPORAL_SQL_TOOL) $(TEMPORAL_UI) $(STRIPE_MOCK) $(PROMTOOL) $(STATICCHECK) $(CHROMIUM) ## Build the Temporal CLI (dev server + Web UI), the Temporal server, its SQL schema tool and the Web UI server (for make cluster), stripe-mock and staticcheck into bin/, put promtool there, and install Chromium for the browser test.

$(TEMPORAL):
	@echo "Building the Temporal CLI $(TEMPORAL_CLI_VERSION) into bin/ (about 5 minutes the first time)..."
	GOBIN=$(BIN) go install github.com/temporalio/cli/cmd/temporal@$(TEMPORAL_CLI_VERSION)

# The Temporal server, its SQL schema tool and the Web UI server, for
# make cluster and internal/tempcluster, built from internal/temporaltools:
# a module of its own (keyed's go.mod stays free of the server's
# dependencies) whose go.mod is the CLI's, so the versions match the dev
# server's (server v1.29.1, ui-server v2.42.1). Seconds after the CLI.
$(TEMPORAL_SERVER):
	cd internal/temporaltools && go build -o $@ go.temporal.io/server/cmd/server

$(TEMPORAL_SQL_TOOL):
	cd internal/temporaltools && go build -o $@ go.temporal.io/server/cmd/tools/sql

$(TEMPORAL_UI):
	cd internal/temporaltools && go build -o $@ ./temporal-ui

$(STRIPE_MOCK):
	GOBIN=$(BIN) go install github.com/stripe/stripe-mock@$(STRIPE_MOCK_VERSION)

# staticcheck is installed from the module proxy at a pinned version; it is
# a tool, not a dependency, so go.mod does not list it.
$(STATICCHECK):
	GOBIN=$(BIN) go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# promtool tests deploy/prometheus's alert rules (go test ./deploy/). A
# promtool on PATH is linked; otherwise apt-get downloads Debian's (or
# Ubuntu's) prometheus package and only promtool is extracted from it: no
# root, no Prometheus service, about 6 s (as root, apt-get warns that it
# downloads unsandboxed: harmless).
$(PROMTOOL):
	@mkdir -p $(BIN)
	@if command -v promtool >/dev/null; then ln -sf "$$(command -v promtool)" $@; else \
	  echo "Fetching promtool from the Debian prometheus package into bin/..."; \
	  tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cd "$$tmp" && \
	  { apt-get download prometheus || { apt-get update -qq && apt-get download prometheus; }; } && \
	  dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x ./usr/bin/promtool && mv usr/bin/promtool $@; fi
	@$@ --version | head -1

# Debian's Chromium, driven headless by tests/browser_test.go against the
# dev server's Web UI. Installed with apt-get (through sudo when not root)
# only when missing.
$(CHROMIUM):
	@echo "Installing Chromium for the Web UI browser test..."
	@sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get install -y chromium || { $$sudo apt-get update -qq && $$sudo apt-get install -y chromium; }
	@$@ --version

.PHONY: fmt
fmt: ## Format the code.
	gofmt -w $$(git ls-files '*.go')

.PHONY: clean
clean: ## Remove built tools and demo state.
	rm -rf bin .demo
