# kvgate build, test and benchmark entry points. `make test` and `make demo` work on a fresh
# machine with Go, node/npm and apt; everything they need is fetched here, pinned by sha256.
GO      ?= go
BIN     := bin/kvgate
PKGS    := ./...
export KVGATE_CACHE := $(CURDIR)/.cache

.PHONY: all build test fetch fmt-check vet demo bench bench-overhead goldens fuzz soak clean

# Fuzz targets as package:Name. `make test` runs each for FUZZ_SHORT executions (24 targets,
# ~1-4 s each). Budgets are counts, never durations: Go 1.26's fuzz coordinator can fail a
# duration-bounded run with a spurious "context deadline exceeded" at the deadline
# (golang/go#75804, fixed in Go 1.27); a count has no deadline to race.
# `make fuzz` runs each for FUZZTIME (default 10M executions; hours in total: override,
# e.g. `make fuzz FUZZTIME=2000000x`, or pick one with FUZZ_TARGETS=./proxy:FuzzHTTPRequest).
FUZZ_TARGETS ?= ./hashcore:FuzzBlockCBOR ./hashcore:FuzzBlockPickle ./ingest:FuzzDecodeBatch \
	./ingest:FuzzTRTEvents ./tokenize:FuzzEncode ./tokenize:FuzzScanners \
	./tokenize/chat:FuzzCompileRender ./tokenize/chat:FuzzMessages ./tokenize/chat:FuzzParseJSON \
	./proxy:FuzzRoute ./proxy:FuzzHTTPRequest ./proxy/openai:FuzzScan ./shard:FuzzOps \
	./hashcore:FuzzSHA256ChainsFused ./ingest:FuzzBadEventIsolation ./hashcore:FuzzSGLangSaltBigram \
	./proxy/route:FuzzParseReport ./tokenize:FuzzMemo ./hashcore:FuzzChainMemo ./internal/zmtp:FuzzRecv \
	./internal/jsonlex:FuzzLex ./proxy/openai:FuzzScanChatParity ./tokenize/chat:FuzzRenderMemo \
	./tokenize:FuzzChatNotes
FUZZ_SHORT ?= 10000x
FUZZTIME ?= 10000000x
define run_fuzz
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $$t ($(1))"; \
		$(GO) test -run '^$$' -fuzz "^$${t##*:}\$$" -fuzztime $(1) $${t%%:*}; \
	done
endef

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
	@# The zero-allocation tests once more without the race detector: its instrumentation
	@# and sync.Pool's deliberate drops under it allocate, so some of them only loosen or
	@# skip their bound there.
	$(GO) test -count=1 -timeout 5m -run 'Alloc' $(PKGS)
	$(call run_fuzz,$(FUZZ_SHORT))

fuzz:
	$(call run_fuzz,$(FUZZTIME))

# Long soak (bounded; SOAK_TIME): saturating load through kvgate to fake engines on
# 127.0.0.1, then 10k concurrent idle streams; asserts flat goroutines and bounded heap
# and reports memory per idle stream (bench/RELIABILITY.md).
SOAK_TIME ?= 3m
soak:
	KVGATE_SOAK=$(SOAK_TIME) KVGATE_SOAK_STREAMS=10000 $(GO) test -count=1 -timeout 30m -run 'TestSoak' -v ./proxy/

# The demo: 4 engine simulators + kvgate on loopback; rr, chwbl, the default KV-Exact and the
# oracle on the shared-prefix and hot-prefix workloads at arrival rates x1, x2, x4; prints the
# tables and writes the report and the TTFT-versus-load plots to bench/out/.
demo: fetch build
	$(BIN) bench -demo -out bench/out

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# kvgate's added latency and req/s against nginx's proxy_pass on the same machine (nginx
# from Debian, installed when missing, as tools/fetch.sh does for the tests' packages).
bench-overhead: build
	@command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || \
		{ apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends nginx >/dev/null; }
	$(BIN) bench -overhead

# Regenerates the committed goldens from independent oracles (Python stdlib, cbor2, xxhash,
# msgpack, jinja2 from Debian; the HF tokenizers library from npm).
goldens: fetch
	@bash tools/goldens.sh

clean:
	rm -rf bin .cache
