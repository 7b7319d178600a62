# GOEXPERIMENT=simd turns on GoMLX's AVX-512/AVX2 kernels: without it the engine runs ~12x slower.
export GOEXPERIMENT := simd

.PHONY: build serve test bench vet

build:
	go build -o skein ./cmd/skein

serve: build
	./skein serve

test:
	go test ./...

vet:
	go vet ./...

bench: build
	test -d /tmp/skein-small || ./skein model init-tiny /tmp/skein-small --preset small --arch qwen2
	./skein bench engine --model /tmp/skein-small
