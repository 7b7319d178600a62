# GOEXPERIMENT=simd turns on GoMLX's AVX-512/AVX2 kernels: without it the engine runs ~12x slower.
export GOEXPERIMENT := simd

.PHONY: build install serve test bench vet

# The version `skein version` prints; -buildvcs=auto records the git revision even where GOFLAGS turns it off.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

build:
	go build -buildvcs=auto -ldflags "-X main.version=$(VERSION)" -o skein ./cmd/skein

# install puts skein on PATH: into $(go env GOBIN), else $(go env GOPATH)/bin.
install:
	go install -buildvcs=auto -ldflags "-X main.version=$(VERSION)" ./cmd/skein

serve: build
	./skein serve

test:
	go test ./...

vet:
	go vet ./...

bench: build
	test -d /tmp/skein-small || ./skein model init-tiny /tmp/skein-small --preset small --arch qwen2
	./skein bench engine --model /tmp/skein-small
