// kstatus reads one Kubernetes object as JSON on stdin and prints what kstatus (sigs.k8s.io/cli-utils,
// the status library behind Flux's health checks, `kpt live status` and cli-utils' appliers) computes
// for it, as JSON: {"status": "Current|InProgress|Failed|Terminating|NotFound|Unknown", "message": ...}.
// The tests hold ModelDeployment statuses to kstatus's own rules with it (tests/unit/chart).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

// sourceHash is set by tools/build-binaries.sh (a hash of this file: part of the build's cache key).
var sourceHash = "dev"

type result struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--version" {
		fmt.Println("kstatus (sigs.k8s.io/cli-utils v0.37.2), source " + sourceHash)
		return
	}
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: reading stdin:", err)
		os.Exit(2)
	}
	// as a client reads it from the apiserver: integers are int64 (encoding/json would make them float64)
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(raw); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: stdin is not a Kubernetes object (apiVersion, kind):", err)
		os.Exit(2)
	}
	res, err := status.Compute(obj)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: status.Compute:", err)
		os.Exit(1)
	}
	out, _ := json.Marshal(result{Status: res.Status.String(), Message: res.Message})
	fmt.Println(string(out))
}
