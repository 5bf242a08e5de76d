GO ?= go


.PHONY: run test build vet bench-herd clean

## run: simulator, API and worker on the local Postgres and Redis (Ctrl-C stops them)
run: build
	scripts/run-local.sh

## test: every test, with the race detector, against the local Postgres and Redis
test:
	scripts/services.sh
	scripts/promtool.sh
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m ./...

build:
	@mkdir -p bin
	$(GO) build -o bin/ ./cmd/...

vet:
	$(GO) vet ./...

clean:
	rm -rf bin
