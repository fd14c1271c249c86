"""localcluster: a real Kubernetes control plane on this machine, for the demo and the tests."""
