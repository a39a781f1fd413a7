# kvgate build, test and benchmark entry points. `make test` and `make demo` work on a fresh
# machine with Go, node/npm and apt; everything they need is fetched here, pinned by sha256.
GO      ?= go
BIN     := bin/kvgate
PKGS    := ./...
export KVGATE_CACHE := $(CURDIR)/.cache

.PHONY: all build test fetch fmt-check vet demo bench goldens fuzz clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/kvgate

fetch:
	@bash tools/fetch.sh

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

test: fetch fmt-check vet
	$(GO) test -race -count=1 -timeout 15m $(PKGS)

# The demo: 4 engine simulators + kvgate on loopback, rr vs KV-Exact on a shared-prefix
# workload; prints the comparison table and writes the report and plots to bench/out/.
demo: fetch build
	$(BIN) bench -demo -out bench/out

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# Regenerates the committed goldens from independent oracles (Python stdlib, cbor2, xxhash,
# msgpack, jinja2 from Debian; the HF tokenizers library from npm).
goldens: fetch
	@bash tools/goldens.sh

clean:
	rm -rf bin .cache
