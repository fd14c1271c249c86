"""Chaos fixtures: the e2e suite's CRDs and operator (tests/e2e/conftest.py), on the session cluster."""

from e2e.conftest import crds, operator

__all__ = ["crds", "operator"]
