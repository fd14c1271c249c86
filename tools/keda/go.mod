// Wrapper module: pins KEDA v2 (the local cluster's event-driven autoscaler: keda-operator and its
// external-metrics server, cmd/adapter). Its go.sum holds the module's hash. No Go file imports it:
// tools/build-binaries.sh builds ./cmd/operator and ./cmd/adapter inside a copy of the module directory
// with KEDA's own go.mod and go.sum (`go install` refuses its replace directive), so `go mod tidy` must
// not be run here (it would drop the requirement).
module modeldeploy.local/tools/keda

go 1.26.0

require github.com/kedacore/keda/v2 v2.21.0
