//go:build tools

// Package tools pins the Gateway API module (its config/crd manifests are used, not its code).
package tools

import (
	_ "sigs.k8s.io/gateway-api/apis/v1"
)
