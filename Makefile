# Shortcuts for the commands in README.md and .ci/run.
GOLANGCI_LINT = github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

.PHONY: all build test race generate lint layers bench ci

all: build

# bothyd-runtime beside bothyd makes sandbox starts faster (see cmd/bothyd-runtime);
# without cgo it also skips a re-exec in each sandbox's init.
build:
	go build -o bin/bothyd ./cmd/bothyd
	go build -o bin/bothy ./cmd/bothy
	CGO_ENABLED=0 go build -o bin/bothyd-runtime ./cmd/bothyd-runtime

test:
	scripts/test

race:
	go test -race ./server/... ./store/... ./supervisor/... ./handlers/... ./platform/...

# The Go code and the TypeScript SDK's types are both generated from openapi/openapi.yaml;
# CI checks that regenerating either changes nothing.
generate:
	go generate ./...
	cd sdk/typescript && npm ci --no-audit --no-fund --ignore-scripts && npm run generate

# lint is golangci-lint (.golangci.yml) and the import rules between packages
# (internal/layers). ci runs both; test runs the rules with the rest of go test ./....
lint: layers
	go run $(GOLANGCI_LINT) run ./...

layers:
	go test -count=1 ./internal/layers

bench:
	go test -run '^$$' -bench . -benchmem ./...

ci:
	bash .ci/run
