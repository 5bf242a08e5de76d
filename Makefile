GO ?= go


.PHONY: run test build vet bench clean

## run: simulator, API and worker on the local Postgres and Redis (Ctrl-C stops them)
run: build
	scripts/run-local.sh

## test: the API description's lint and typed client, then every Go test with the race
## detector against the local Postgres and Redis (npm installs test/js when it is stale;
## scripts/browser.sh installs Chromium and test/browser for the console's browser suite)
test:
	scripts/services.sh --with-cluster
	scripts/js.sh check
	scripts/browser.sh
	scripts/promtool.sh
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 30m ./...
	# The allocation bars, which skip under -race (its instrumentation allocates):
	$(GO) test -count=1 -timeout 5m -run Allocs $$(grep -rl --include=*_test.go 'Allocs(t \*testing.T)' internal | xargs -n1 dirname | sort -u | sed 's|^|./|')
	cd bench && $(GO) vet ./... && $(GO) test -race -count=1 ./...

## bench: every table of docs/benchmarks.md measured again and written there (BENCHES=herd for one)
BENCHES ?= herd outage tokens chaos throughput rate backlog retention batch stream fairness
bench: build
	scripts/services.sh
	cd bench && for b in $(BENCHES); do $(GO) run . $$b -write ../docs/benchmarks.md || exit 1; done

build:
	@mkdir -p bin
	$(GO) build -o bin/ ./cmd/...

vet:
	$(GO) vet ./...

clean:
	rm -rf bin
