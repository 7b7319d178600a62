module github.com/skein-ai/skein

go 1.26.8

require (
	github.com/dlclark/regexp2 v1.11.5
	github.com/gomlx/compute v0.1.2
	github.com/gomlx/gomlx v0.28.2
	github.com/klauspost/compress v1.20.4
	golang.org/x/text v0.44.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	golang.org/x/exp v0.0.0-20260410095643-746e56fc9e2f // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
)
