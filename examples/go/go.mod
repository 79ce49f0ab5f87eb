module github.com/dlq-sidecar/examples/go

go 1.22
