// CoreDNS with only the plugins the local cluster's DNS uses (the documented way to compile a
// smaller CoreDNS: a main that sets dnsserver.Directives and imports just those plugins). The
// Corefile the local cluster writes (tools/localcluster/clusterdns.py) uses these and nothing else.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order of execution, as in CoreDNS's own plugin.cfg.
var directives = []string{
	"bind",
	"ready",
	"health",
	"errors",
	"cache",
	"kubernetes",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
