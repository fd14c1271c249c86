// Wrapper module: pins Traefik v3 (the Gateway API data plane of the local cluster). Its go.sum holds
// the module's hash. No Go file imports it: tools/build-binaries.sh builds ./cmd/traefik inside a copy
// of the module directory with Traefik's own go.mod and go.sum (`go install` refuses its replace
// directives), so `go mod tidy` must not be run here (it would drop the requirement).
module modeldeploy.local/tools/traefik

go 1.26.0

require github.com/traefik/traefik/v3 v3.6.12
