"""modeldeploy: the Kubernetes operator of ModelDeploy.

Modules, by layer (operator -> reconciler -> plan -> canary -> builders -> api):

* the API: :mod:`.api` (the ModelDeployment and pod specs), :mod:`.api_base` (names, patterns, the models'
  base and CEL helpers), :mod:`.api_rollout` (``spec.rollout`` and beside it), :mod:`.api_generation`
  (``spec.generation``), :mod:`.api_status`; :mod:`.crdgen` (the CRD YAML from them);
* pure decisions: :mod:`.builders` (desired children), :mod:`.model_storage` (the fetch init container and
  volumes), :mod:`.plan` (one reconcile's plan), :mod:`.status_build` (the one place status is built),
  :mod:`.rollout_decision` (the one place the final Decision is made), :mod:`.canary`
  (the rollout state machine) with
  :mod:`.rollout_types`, :mod:`.rollout_context`, :mod:`.shadow_stage`, :mod:`.gate_stage` and
  :mod:`.traffic_split`,
  :mod:`.fallback` (the CPU fallback), :mod:`.routing` (Gateway API routes), :mod:`.autoscaling` (KEDA),
  :mod:`.analysis` (queries and verdicts) with :mod:`.judge_stats` (the statistical judge),
  :mod:`.promql_scope` (a custom query held to its namespace), :mod:`.status` / :mod:`.diff` (status and
  what changed), :mod:`.oom` (containers killed for their memory limit, from pod statuses);
* I/O: :mod:`.reconciler` (one reconcile), :mod:`.measurements` and :mod:`.promclient` (Prometheus,
  off the reconcile path), :mod:`.kube` (the apiserver), :mod:`.childcache` and :mod:`.resync` (what the
  watches and LISTs saw), :mod:`.events` (Events, posted in the background), :mod:`.notify` (rollout
  webhooks, delivered in the background), :mod:`.gates` (rollout gates, asked in the background),
  :mod:`.loop_thread` (the event loop those three run in), :mod:`.metrics`;
* wiring: :mod:`.controller` (work queue, peering gate), :mod:`.operator` (kopf, ``python -m
  modeldeploy``) with :mod:`.settings` (its flags and environment), :mod:`.cli` (``kubectl-modeldeploy``) with
  :mod:`.dashboard` and :mod:`.dashboard_page` (``kubectl modeldeploy dashboard``: a local web page).
"""

__version__ = "0.1.0"
