"""modeldeploy: the Kubernetes operator of ModelDeploy.

Modules: :mod:`.api` (the pydantic models = the CRD's schema), :mod:`.crdgen` (the CRD YAML),
:mod:`.builders` (desired children, pure), :mod:`.plan` / :mod:`.status` / :mod:`.diff` (the reconcile
plan, pure), :mod:`.reconciler` (I/O of one reconcile), :mod:`.controller` (work queue, peering gate),
:mod:`.operator` (kopf wiring, ``python -m modeldeploy``), :mod:`.cli` (``kubectl-modeldeploy``).
"""

__version__ = "0.1.0"
