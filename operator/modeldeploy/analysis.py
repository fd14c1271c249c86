"""Canary analysis: which PromQL to ask, and what the answers mean.

Split in two on purpose:

* pure: :func:`build_queries` (the queries for one revision and window, from the spec and the server's
  metrics contract), :func:`judge` (samples -> a verdict with its measurements) and :func:`advance`
  (a verdict folded into the analysis state kept in status: consecutive failures, ``onNoData``,
  ``noDataTimeout``, ``failureLimit``);
* I/O is elsewhere: :mod:`modeldeploy.measurements` runs the queries off the reconcile path through
  :mod:`modeldeploy.promclient`. A query has three outcomes, as in Argo Rollouts: a value, *no data* (it
  answered with no samples) and an *error* (timeout, refused, non-2xx, unparseable, more than one
  series): ``onNoData`` governs no data only; an error holds the window and never passes it, and
  ``errorLimit`` consecutive erroring windows pause the rollout for a human.

The default checks use the server's metrics contract (docs/server.md) with the pod labels Prometheus
carries over from discovery (``modeldeploy_io_name``, ``modeldeploy_io_revision``):

* ``requests``: requests the revision answered in the window; fewer than ``minRequests`` is *no data*;
* ``error-rate``: the server's own failures (5xx, and 413/429 from its admission control) / all requests
  of the revision (max ``maxErrorRate``);
* ``client-error-rate-increase``: the revision's 4xx share (413/429 excepted) minus the stable's in the same
  window (max ``maxClientErrorRateIncrease``; only with a stable revision to compare with): a revision
  that answers 404 to every client is a failure, not a pass;
* ``p99-latency-ms``: p99 of ``modelserver_request_duration_seconds`` (max ``maxP99LatencyMs``), not for
  ``task: generation`` (a streamed request lasts as long as its answer), which has instead, when set,
  ``ttft-p99-ms`` (p99 of ``modelserver_generation_time_to_first_token_seconds``, max ``maxTTFTP99Ms``) and
  ``tpot-p99-ms`` (p99 of ``modelserver_generation_time_per_output_token_seconds``, max
  ``maxTimePerOutputTokenP99Ms``);
* ``latency-ratio-to-stable``: canary p99 / stable p99 (max ``maxLatencyRatioToStable``, only when set
  and when there is a stable revision in traffic to compare with);
* every ``metrics[]`` entry: a PromQL template with ``{{namespace}} {{name}} {{revision}} {{interval}}``
  and a ``max`` or ``min`` threshold;
* ``agreement`` (only with ``minAgreement``): the share of compared requests whose outputs agreed, from
  the stable servers' ``modelserver_shadow_requests_total{shadow_revision}`` (see :mod:`modelserver.shadow`).

The shadow stage (:func:`build_shadow_queries`) judges the shadow revision by ``shadow-samples`` (compared
requests; fewer than ``minSamples`` is *no data*), ``agreement`` (min ``minAgreement``),
``shadow-error-rate`` (copies answered with an error or not at all, max ``maxErrorRate``), the shadow
server's own ``p99-latency-ms`` (max ``maxP99LatencyMs``; for ``task: generation`` its ``ttft-p99-ms`` and
``tpot-p99-ms`` where set, a copy being a whole answer), and reports ``shadow-dropped`` (copies the
stable's bounded queue dropped: our capacity, not the shadow's fault) without judging it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from . import judge_stats
from .api import AnalysisSpec, AnalysisStatus, JudgeMeasurement, Measurement, ShadowSpec, parse_duration
from .promql_scope import render, scoped

REQUESTS = "requests"
ERROR_RATE = "error-rate"
CLIENT_ERRORS = "client-error-rate-increase"
P99 = "p99-latency-ms"
TTFT = "ttft-p99-ms"
TPOT = "tpot-p99-ms"
RATIO = "latency-ratio-to-stable"
SAMPLES = "shadow-samples"
AGREEMENT = "agreement"
SHADOW_ERROR_RATE = "shadow-error-rate"
SHADOW_DROPPED = "shadow-dropped"
JUDGE_LATENCY = "judge-latency-ms"
JUDGE_TTFT = "judge-ttft-ms"
JUDGE_ERRORS = "judge-error-rate"
#: measurements whose shortfall is "not enough data", not a failure
VOLUME_METRICS = (REQUESTS, SAMPLES)
#: measurements kept in status at most, whatever measurementRetention says (the newest)
MEASUREMENTS_CAP = 512

Verdict = Literal["Pass", "Fail", "NoData", "Error", "Inconclusive"]

#: the server's own failures: 5xx, and 413/429 from its admission control (too large, queue full)
SERVER_ERROR_CODES = 'code=~"5..|413|429"'
#: the clients' errors as the server answered them (400, 404 for an unknown model name, 422, ...)
CLIENT_ERROR_CODES = 'code=~"4..",code!~"413|429"'


@dataclass(frozen=True)
class JudgeParams:
    """How a judged query is asked and compared: a range query of the window (``window`` seconds) in
    samples of ``step`` seconds, for the revision (``Query.promql``) and the stable (``baseline``)."""

    baseline: str  # the same PromQL for the stable revision
    window: float  # seconds
    step: float  # seconds: one sample
    confidence: float
    min_samples: int
    relative: bool  # the increase relative to the stable's median (latency), else absolute (a share)


@dataclass(frozen=True)
class Query:
    metric: str
    promql: str
    threshold: float | None
    kind: Literal["max", "min"]
    revision: str
    #: optional checks do not make the whole window "no data" when they have none (the stable ratio)
    optional: bool = False
    #: measured and shown, never decisive (analysis.dryRun)
    dry_run: bool = False
    #: a statistical comparison with the stable (analysis.judge): range queries, not one instant value
    judge: JudgeParams | None = None


@dataclass(frozen=True)
class Sample:
    query: Query
    value: float | None  # None: the query answered with no samples (or NaN): no data
    error: str | None = None  # the query failed (timeout, refused, non-2xx, unparseable, wrong shape)
    #: judged queries: the revision's and the stable's samples over the window
    series: tuple[float, ...] | None = None
    baseline: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    measurements: list[Measurement]
    failing: Measurement | None  # the first failing (or missing) measurement


def window(interval: str) -> str:
    """The PromQL range of one analysis window (``interval`` as whole seconds, at least 2s)."""
    return f"{max(2, math.ceil(parse_duration(interval)))}s"


def _selector(namespace: str, name: str, revision: str, extra: str = "") -> str:
    sel = f'namespace="{namespace}",modeldeploy_io_name="{name}",modeldeploy_io_revision="{revision}"'
    return "{" + sel + (f",{extra}" if extra else "") + "}"


def p99_query(
    namespace: str,
    name: str,
    revision: str,
    win: str,
    histogram: str = "modelserver_request_duration_seconds",
) -> str:
    """The p99 of a server histogram (seconds) over ``win``, in milliseconds."""
    sel = _selector(namespace, name, revision)
    rate = f"rate({histogram}_bucket{sel}[{win}])"
    return f"histogram_quantile(0.99, sum by (le) ({rate})) * 1000"


def _generation_latency(
    spec: AnalysisSpec, namespace: str, name: str, revision: str, win: str
) -> list[Query]:
    """TTFT and time per output token, each when its threshold is set."""
    out = []
    for metric, histogram, limit in (
        (TTFT, "modelserver_generation_time_to_first_token_seconds", spec.max_ttft_p99_ms),
        (TPOT, "modelserver_generation_time_per_output_token_seconds", spec.max_time_per_output_token_p99_ms),
    ):
        if limit is not None:
            q = p99_query(namespace, name, revision, win, histogram)
            out.append(Query(metric, q, float(limit), "max", revision))
    return out


def _copies(namespace: str, name: str, shadow: str, results: str, win: str) -> str:
    sel = (
        f'{{namespace="{namespace}",modeldeploy_io_name="{name}",shadow_revision="{shadow}",'
        f'result=~"{results}"}}'
    )
    return f"sum(increase(modelserver_shadow_requests_total{sel}[{win}]))"


def agreement_queries(namespace: str, name: str, shadow: str, win: str) -> tuple[str, str]:
    """(compared requests, share that agreed) of the copies to ``shadow`` over ``win``."""
    compared = _copies(namespace, name, shadow, "agree|disagree", win)
    agreed = _copies(namespace, name, shadow, "agree", win)
    return compared, f"{agreed} / {compared}"


def build_shadow_queries(
    shadow: ShadowSpec,
    spec: AnalysisSpec,
    *,
    namespace: str,
    name: str,
    revision: str,
    interval: str,
    min_samples: float | None = None,
    generation: bool = False,
) -> list[Query]:
    """The queries that judge the shadow ``revision`` over the last ``interval`` (pure).
    ``min_samples`` defaults to ``shadow.minSamples`` (a shorter window than the whole stage scales it).
    ``generation``: the shadow's time to first token and per output token (when set) instead of its
    request p99 -- a copy is a whole answer, as long as its text."""
    win = window(interval)
    compared, agreement = agreement_queries(namespace, name, revision, win)
    failed = _copies(namespace, name, revision, "error|timeout", win)
    sent = _copies(namespace, name, revision, "agree|disagree|error|timeout", win)
    need = float(shadow.min_samples if min_samples is None else min_samples)
    latency = (
        _generation_latency(spec, namespace, name, revision, win)
        if generation
        else [
            Query(
                P99,
                p99_query(namespace, name, revision, win),
                float(spec.max_p99_latency_ms),
                "max",
                revision,
            )
        ]
    )
    queries = [
        Query(SAMPLES, compared, need, "min", revision),
        Query(AGREEMENT, agreement, shadow.min_agreement, "min", revision),
        Query(SHADOW_ERROR_RATE, f"({failed} or vector(0)) / {sent}", spec.max_error_rate, "max", revision),
        *latency,
        Query(
            SHADOW_DROPPED, _copies(namespace, name, revision, "dropped", win), None, "max", revision, True
        ),
    ]
    return _dry(queries, spec.dry_run)


def _increase(sel: str, win: str) -> str:
    return f"sum(increase(modelserver_requests_total{sel}[{win}]))"


def client_error_increase_query(namespace: str, name: str, revision: str, stable: str, win: str) -> str:
    """The canary's 4xx share minus the stable's over ``win`` (the stable's share is 0 when it answered
    nothing in the window, so the canary is then held to ``maxClientErrorRateIncrease`` outright)."""

    def share(rev: str) -> str:
        total = _increase(_selector(namespace, name, rev), win)
        client = _increase(_selector(namespace, name, rev, CLIENT_ERROR_CODES), win)
        return f"(({client} or vector(0)) / ({total} > 0))"

    return f"({share(revision)} or vector(0)) - ({share(stable)} or vector(0))"


def _mean_ms(histogram: str, sel: str, step: str) -> str:
    """The mean of a server histogram (seconds) over each ``step``, in milliseconds."""
    rate = f"sum(rate({histogram}_sum{sel}[{step}])) / sum(rate({histogram}_count{sel}[{step}]))"
    return f"{rate} * 1000"


def _error_share(sel: str, bad_sel: str, step: str) -> str:
    """The share of server errors among the requests of each ``step`` (0 when none failed)."""
    total = f"sum(rate(modelserver_requests_total{sel}[{step}]))"
    return f"(sum(rate(modelserver_requests_total{bad_sel}[{step}])) or {total} * 0) / {total}"


def judge_queries(
    spec: AnalysisSpec,
    *,
    namespace: str,
    name: str,
    revision: str,
    stable: str,
    interval: str,
    generation: bool = False,
) -> list[Query]:
    """The statistical judge's queries (``analysis.judge``, pure): the mean latency (for generation the
    mean time to first token) and the server error share of each ``sampleInterval`` of the window, for
    ``revision`` and for ``stable``, compared by :func:`modeldeploy.judge_stats.compare`."""
    j = spec.judge
    assert j is not None
    step_s = max(1.0, parse_duration(j.sample_interval))
    step = f"{math.ceil(step_s)}s"
    win = float(max(2, math.ceil(parse_duration(interval))))
    metric, histogram = (
        (JUDGE_TTFT, "modelserver_generation_time_to_first_token_seconds")
        if generation
        else (JUDGE_LATENCY, "modelserver_request_duration_seconds")
    )
    sel = {rev: _selector(namespace, name, rev) for rev in (revision, stable)}
    bad = {rev: _selector(namespace, name, rev, SERVER_ERROR_CODES) for rev in (revision, stable)}

    def params(baseline: str, relative: bool) -> JudgeParams:
        return JudgeParams(baseline, win, step_s, j.confidence, j.min_samples, relative)

    latency = {rev: _mean_ms(histogram, sel[rev], step) for rev in sel}
    errors = {rev: _error_share(sel[rev], bad[rev], step) for rev in sel}
    return [
        Query(
            metric, latency[revision], j.max_increase, "max", revision, judge=params(latency[stable], True)
        ),
        Query(
            JUDGE_ERRORS,
            errors[revision],
            j.max_error_increase,
            "max",
            revision,
            judge=params(errors[stable], False),
        ),
    ]


def _dry(queries: list[Query], dry_run: Sequence[str]) -> list[Query]:
    """``queries`` with those named in ``analysis.dryRun`` marked: measured, never decisive."""
    names = set(dry_run)
    return [dataclasses.replace(q, dry_run=True) if q.metric in names else q for q in queries]


def build_queries(
    spec: AnalysisSpec,
    *,
    namespace: str,
    name: str,
    revision: str,
    stable: str | None,
    interval: str,
    agreement_with: str | None = None,
    generation: bool = False,
) -> list[Query]:
    """The queries that judge ``revision`` over the last ``interval`` (pure). With ``minAgreement`` and
    ``agreement_with`` (the revision the stable servers copy to), the agreement of those copies too.
    The 4xx and latency comparisons need a ``stable`` in the same window; without one (the last step at
    100 %, bakeTime) they are not asked. ``generation`` (``task: generation``): time to first token and
    per output token instead of the request latency."""
    win = window(interval)
    total = _increase(_selector(namespace, name, revision), win)
    bad = _increase(_selector(namespace, name, revision, SERVER_ERROR_CODES), win)
    out = [
        Query(REQUESTS, total, float(spec.min_requests), "min", revision),
        Query(ERROR_RATE, f"({bad} or vector(0)) / {total}", spec.max_error_rate, "max", revision),
    ]
    if generation:
        out += _generation_latency(spec, namespace, name, revision, win)
    else:
        p99 = p99_query(namespace, name, revision, win)
        out.append(Query(P99, p99, float(spec.max_p99_latency_ms), "max", revision))
    compare = stable is not None and stable != revision
    if compare and spec.max_client_error_rate_increase < 1:
        assert stable is not None
        out.append(
            Query(
                CLIENT_ERRORS,
                client_error_increase_query(namespace, name, revision, stable, win),
                spec.max_client_error_rate_increase,
                "max",
                revision,
            )
        )
    if spec.max_latency_ratio_to_stable is not None and compare and not generation:
        assert stable is not None
        out.append(
            Query(
                RATIO,
                f"({p99_query(namespace, name, revision, win)})"
                f" / ({p99_query(namespace, name, stable, win)})",
                spec.max_latency_ratio_to_stable,
                "max",
                revision,
                optional=True,
            )
        )
    if spec.judge is not None and compare:
        assert stable is not None
        out += judge_queries(
            spec,
            namespace=namespace,
            name=name,
            revision=revision,
            stable=stable,
            interval=interval,
            generation=generation,
        )
    if spec.min_agreement is not None and agreement_with is not None:
        _, agreement = agreement_queries(namespace, name, agreement_with, win)
        out.append(Query(AGREEMENT, agreement, spec.min_agreement, "min", revision))
    for m in spec.metrics:
        q = render(m.query, namespace=namespace, name=name, revision=revision, interval=win)
        # what Prometheus runs is the checked expression (ModelDeployment.from_api refused the rest)
        q = scoped(q, namespace)
        if m.max is not None:
            out.append(Query(m.name, q, m.max, "max", revision))
        else:
            out.append(Query(m.name, q, m.min, "min", revision))
    return _dry(out, spec.dry_run)


def _compared(s: Sample, now: datetime) -> Measurement:
    """A judged query's measurement: the value is the increase (relative or absolute), the threshold the
    allowed increase, and ``judge`` what was compared."""
    q, p = s.query, s.query.judge
    assert p is not None
    c = judge_stats.compare(
        s.series or (),
        s.baseline or (),
        confidence=p.confidence,
        max_increase=float(q.threshold or 0.0),
        min_samples=p.min_samples,
        relative=p.relative,
    )
    return Measurement(
        metric=q.metric,
        query=q.promql,
        value=None if c.effect is None else round(c.effect, 6),
        threshold=q.threshold,
        verdict=c.verdict,
        revision=q.revision,
        time=now,
        dry_run=q.dry_run or None,
        judge=JudgeMeasurement(
            canary=_round(c.canary_median),
            stable=_round(c.stable_median),
            canary_samples=c.canary_n,
            stable_samples=c.stable_n,
            low=_round(c.low),
            high=_round(c.high),
            p_value=_round(c.p_value),
            reason=c.reason[:256],
        ),
    )


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _measure(s: Sample, now: datetime) -> Measurement:
    q = s.query
    if q.judge is not None and s.error is None:
        return _compared(s, now)
    if s.error is not None:
        verdict: Literal["Pass", "Fail", "NoData", "Error"] = "Error"
    elif s.value is None:
        verdict = "NoData"
    elif q.threshold is None:
        verdict = "Pass"
    elif q.metric in VOLUME_METRICS:
        verdict = "Pass" if s.value >= q.threshold else "NoData"
    elif q.kind == "max":
        verdict = "Pass" if s.value <= q.threshold else "Fail"
    else:
        verdict = "Pass" if s.value >= q.threshold else "Fail"
    value = None if s.value is None else round(s.value, 6)
    return Measurement(
        metric=q.metric,
        query=q.promql,
        value=value,
        threshold=q.threshold,
        verdict=verdict,
        revision=q.revision,
        time=now,
        error=None if s.error is None else s.error[:512],
        dry_run=q.dry_run or None,
    )


def judge(samples: Sequence[Sample], now: datetime) -> Judgement:
    """One window's verdict (pure). Dry-run measurements (``analysis.dryRun``) are measured and kept but
    never counted below.

    * any query that failed (timeout, refused, non-2xx, unparseable, more than one series) -> Error:
      never a pass, and not *no data* either (``onNoData`` does not apply to it);
    * too few requests (``minRequests``) -> NoData, whatever the other values say; too few compared
      shadow requests (``minSamples``) -> NoData unless the shadow's error rate or p99 fails;
    * any check over (max) or under (min) its threshold, or a judge comparison that fails -> Fail;
    * a required check without a value -> NoData;
    * a judge comparison that cannot tell (too few samples, too wide an interval) -> Inconclusive;
    * otherwise Pass.
    """
    ms = [_measure(s, now) for s in samples]
    decisive = [m for m in ms if not m.dry_run]
    by_metric = {m.metric: m for m in decisive}
    errors = [m for m in decisive if m.verdict == "Error"]
    if errors:
        return Judgement("Error", ms, errors[0])
    failed = [m for m in decisive if m.verdict == "Fail"]
    req = by_metric.get(REQUESTS) or by_metric.get(SAMPLES)
    if req is not None and req.verdict != "Pass":
        # a shadow whose copies fail or are slow fails, however few of them could be compared
        broken = [m for m in failed if req.metric == SAMPLES and m.metric in (SHADOW_ERROR_RATE, P99)]
        if broken:
            return Judgement("Fail", ms, broken[0])
        return Judgement("NoData", ms, req)
    if failed:
        return Judgement("Fail", ms, failed[0])
    optional = {s.query.metric for s in samples if s.query.optional}
    missing = [m for m in decisive if m.verdict == "NoData" and m.metric not in optional]
    if missing:
        return Judgement("NoData", ms, missing[0])
    unsure = [m for m in decisive if m.verdict == "Inconclusive"]
    if unsure:
        return Judgement("Inconclusive", ms, unsure[0])
    return Judgement("Pass", ms, None)


def retained(measurements: Sequence[Measurement], per_metric: int) -> list[Measurement]:
    """The newest ``per_metric`` measurements of each metric (and revision), in their order
    (``analysis.measurementRetention``; Argo Rollouts keeps measurements per metric the same way)."""
    seen: dict[tuple[str, str | None], int] = {}
    keep: list[Measurement] = []
    for m in reversed(measurements):
        key = (m.metric, m.revision)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= per_metric:
            keep.append(m)
    return keep[::-1][-MEASUREMENTS_CAP:]


@dataclass(frozen=True)
class Outcome:
    """What a judged window means for the rollout."""

    action: Literal["pass", "fail", "hold", "pause"]
    state: AnalysisStatus
    reason: str
    failing: Measurement | None
    verdict: Verdict = "Pass"  # the window's effective verdict (after onNoData)


def advance(spec: AnalysisSpec, state: AnalysisStatus | None, j: Judgement, now: datetime) -> Outcome:
    """Fold one judgement into the analysis state (pure).

    ``pass``: go on (next step, promotion, end of bake); ``fail``: ``failureLimit`` consecutive failed
    windows (or no data past ``noDataTimeout`` with ``onNoData: hold``, or no data with ``onNoData: fail``)
    -- roll back; ``hold``: judge again after another interval; ``pause``: ``errorLimit`` consecutive
    windows whose queries failed -- nothing is judged until a human resumes (Argo Rollouts'
    ``consecutiveErrorLimit``). An error never passes, never fails, and leaves ``onNoData`` alone.
    """
    old = state or AnalysisStatus()
    kept = retained([*old.measurements, *j.measurements], spec.measurement_retention)
    if j.verdict == "Error":
        return _errored(spec, old, j, now, kept)
    if j.verdict == "Inconclusive":
        return _inconclusive(spec, old.model_copy(update={"consecutive_errors": 0}), j, now, kept)
    old = old.model_copy(update={"consecutive_errors": 0, "consecutive_inconclusive": 0})
    failures = old.consecutive_failures
    no_data_since = old.no_data_since
    verdict = j.verdict
    reason = ""
    if verdict == "NoData":
        what = _describe(j.failing) if j.failing else "no data"
        if spec.on_no_data == "pass":
            verdict = "Pass"
            reason = f"{what}; onNoData is pass"
        elif spec.on_no_data == "fail":
            verdict = "Fail"
            reason = f"{what}; onNoData is fail"
        else:
            no_data_since = no_data_since or now
            waited = (now - no_data_since).total_seconds()
            if waited >= parse_duration(spec.no_data_timeout):
                failures = max(failures, spec.failure_limit - 1)  # the timeout fails at once
                verdict = "Fail"
                reason = f"{what} for {waited:.0f}s (noDataTimeout {spec.no_data_timeout})"
            else:
                new = old.model_copy(
                    update={"no_data_since": no_data_since, "last_run": now, "measurements": kept}
                )
                return Outcome("hold", new, f"{what}; holding (onNoData hold)", j.failing, "NoData")
    if verdict == "Pass":
        new = old.model_copy(
            update={"consecutive_failures": 0, "no_data_since": None, "last_run": now, "measurements": kept}
        )
        return Outcome("pass", new, reason or "all checks passed", j.failing, "Pass")
    failures += 1
    reason = reason or (_describe(j.failing) if j.failing else "analysis failed")
    new = old.model_copy(
        update={
            "consecutive_failures": failures,
            "no_data_since": None if j.verdict != "NoData" else no_data_since,
            "last_run": now,
            "measurements": kept,
        }
    )
    if failures >= spec.failure_limit:
        return Outcome(
            "fail", new, f"{reason} ({failures}/{spec.failure_limit} failed checks)", j.failing, "Fail"
        )
    return Outcome(
        "hold", new, f"{reason} ({failures}/{spec.failure_limit} failed checks)", j.failing, "Fail"
    )


def _errored(
    spec: AnalysisSpec, old: AnalysisStatus, j: Judgement, now: datetime, kept: list[Measurement]
) -> Outcome:
    """A window whose queries failed: held; the ``errorLimit``-th in a row pauses the rollout."""
    what = _describe(j.failing) if j.failing else "a query failed"
    count = old.consecutive_errors + 1
    return _held(
        old, j, now, kept, ("consecutive_errors", count, spec.error_limit), what, "consecutive query errors"
    )


def _inconclusive(
    spec: AnalysisSpec, old: AnalysisStatus, j: Judgement, now: datetime, kept: list[Measurement]
) -> Outcome:
    """A window the judge could not tell: held; the ``inconclusiveLimit``-th in a row pauses the rollout
    for a human (Argo Rollouts' inconclusive semantics)."""
    assert spec.judge is not None and j.failing is not None
    counter = ("consecutive_inconclusive", old.consecutive_inconclusive + 1, spec.judge.inconclusive_limit)
    return _held(old, j, now, kept, counter, _describe(j.failing), "inconclusive windows")


def _held(
    old: AnalysisStatus,
    j: Judgement,
    now: datetime,
    kept: list[Measurement],
    counter: tuple[str, int, int],
    what: str,
    counted: str,
) -> Outcome:
    """A window that neither passes nor fails (its queries failed, or the judge could not tell): held,
    counted in ``counter`` (status field, new count, limit); at the limit the rollout pauses for a human."""
    field, count, limit = counter
    reason = f"{what} ({count}/{limit} {counted})"
    paused = count >= limit
    new = old.model_copy(
        update={
            field: count,
            "last_run": now,
            "measurements": kept,
            "paused_reason": f"analysis paused: {reason}" if paused else None,
        }
    )
    return Outcome("pause" if paused else "hold", new, reason, j.failing, j.verdict)


def _describe(m: Measurement) -> str:
    if m.verdict == "Error":
        return f"{m.metric}: query failed: {m.error or 'unknown error'} [query: {m.query}]"
    if m.judge is not None:
        return f"{m.metric}: {m.verdict}: {m.judge.reason}"
    if m.value is None:
        return f"{m.metric}: no data"
    if m.metric == REQUESTS:
        return f"requests: {m.value:g} < minRequests {m.threshold:g}"
    if m.metric == SAMPLES:
        return f"compared requests: {m.value:g} < minSamples {m.threshold:g}"
    op = ">" if m.verdict == "Fail" and m.threshold is not None and m.value > m.threshold else "<"
    if m.verdict != "Fail":
        op = "vs"
    return f"{m.metric}: {m.value:g} {op} {m.threshold:g}"
