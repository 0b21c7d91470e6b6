# kvpick: the prefix-cache-aware endpoint picker.
GO      ?= go
BIN     ?= bin
PKGS    ?= ./...

include e2e/kind/Makefile.inc

.PHONY: all build test test-short test-kube kube-assets bench fuzz fuzz-ci lint fmt vet demo e2e e2e-kind clean

all: lint test build

## build: compile every command into ./bin
build:
	$(GO) build -o $(BIN)/ ./cmd/...

## test: the project's test suite, with the race detector (what CI runs); includes the tests
## against a real Kubernetes API server, whose binaries kube-assets builds once (~15 min cold)
test: lint
	@assets="$${KUBE_ASSETS:-$$(./hack/kube-binaries.sh)}" || exit 1; \
	echo "KUBE_ASSETS=$$assets"; \
	KUBE_ASSETS="$$assets" KUBE_ASSETS_REQUIRED=1 $(GO) test -race -count=1 -timeout 20m $(PKGS)
	$(MAKE) --no-print-directory fuzz-ci

## kube-assets: build etcd and kube-apiserver for the integration tests (cached by version
## under $${XDG_CACHE_HOME:-~/.cache}/kvpick; prints the directory)
kube-assets:
	./hack/kube-binaries.sh

## test-kube: only the tests against a real API server (Kubernetes discovery, HA, the CRDs,
## the manifests' server-side dry runs)
KUBE_PKGS ?= ./internal/kubetest ./pkg/discovery ./pkg/ha ./e2e/kubeapi ./manifests
test-kube:
	@assets="$${KUBE_ASSETS:-$$(./hack/kube-binaries.sh)}" || exit 1; \
	KUBE_ASSETS="$$assets" KUBE_ASSETS_REQUIRED=1 $(GO) test -race -count=1 -timeout 20m $(KUBE_PKGS)

## test-short: unit tests only, skipping the process-level end-to-end suite
test-short:
	$(GO) test -race -short -count=1 $(PKGS)

## bench: the benchmarks recorded in docs/benchmarks.md (decision path, index memory, parser,
## ext_proc server, model-server scraping)
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./pkg/runner ./pkg/prefix ./pkg/openai ./pkg/extproc ./pkg/scrape

## fuzz: run every fuzz target of the repository (func Fuzz* in a _test.go file) for FUZZTIME
## each (default 60s); go test fuzzes one target of one package at a time. hack/fuzz.sh passes a
## run whose only failure is Go 1.26's -fuzztime deadline race (go.dev/issue/75804).
FUZZTIME ?= 60s
fuzz:
	@GO='$(GO)' sh hack/fuzz.sh $(FUZZTIME)

## fuzz-ci: every fuzz target for 15s each (make test runs it; the seeds and corpora under
## testdata/fuzz also run as plain tests in every go test)
fuzz-ci:
	@$(MAKE) --no-print-directory fuzz FUZZTIME=15s

## lint: formatting and vet
lint: fmt vet

fmt:
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './.git/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags kind ./e2e/kind/

## e2e: the local end-to-end suite: picker, simulators and the dev gateway as real processes
e2e:
	$(GO) test -race -count=1 -timeout 10m ./e2e/

## image: build the picker's container image IMAGE from the Dockerfile; PUSH=1 also pushes it
## (no image is published: `make image IMAGE=<registry>/kvpick:<tag> PUSH=1`, docs/deploy.md)
IMAGE     ?= kvpick.local/kvpick:dev
SIM_IMAGE ?= kvpick.local/simserver:dev
DOCKER    ?= docker
PUSH      ?=
.PHONY: image image-simserver
image:
	$(DOCKER) build --target extproc -t $(IMAGE) .
	@if [ -n "$(PUSH)" ]; then $(DOCKER) push $(IMAGE); fi

## image-simserver: the simulated vLLM server's image SIM_IMAGE (the kind suite's model servers)
image-simserver:
	$(DOCKER) build --target simserver -t $(SIM_IMAGE) .
	@if [ -n "$(PUSH)" ]; then $(DOCKER) push $(SIM_IMAGE); fi

## demo: start the demo stack and replay the demo workload against round-robin
demo:
	$(GO) run ./cmd/demo --load

clean:
	rm -rf $(BIN)
