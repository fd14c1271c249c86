"""What a custom analysis query may read: its own namespace's series, nothing else (issue 24, finding 6).

``spec.rollout.analysis.metrics[].query`` is PromQL that the operator runs with its own Prometheus
identity, and its value lands in status and Events: without a check, the author of a ModelDeployment in
namespace A could read any series of namespace B. So every vector selector of the query (inside range
selectors, subqueries and function calls too) must carry the equality matcher
``namespace="<the ModelDeployment's namespace>"``. A regex or a negative matcher on
``namespace``, or none at all, is refused: the check names the selector. Write
``namespace="{{namespace}}"`` in every selector of a custom query. ``{a="1" or b="2"}`` (Prometheus 3's
alternatives inside one selector) is refused: the parser renders it wrongly; write ``a or b`` instead.

Parsing is GreptimeTeam's ``promql-parser`` (the Rust PromQL parser, Python binding). What is sent to
Prometheus is that parser's own rendering of the checked expression, not the text as written, so a
query that two parsers read differently cannot slip a selector past the check (prom-label-proxy does the
same: it re-serializes the expression it enforced). The ``namespace`` label itself is trustworthy as
long as Prometheus attaches it from the target (``kubernetes_sd`` relabelling, ``honor_labels: false``,
the default): a pod cannot export series that claim another namespace.
"""

from __future__ import annotations

import promql_parser as pp


def render(template: str, *, namespace: str, name: str, revision: str, interval: str) -> str:
    """A custom metric's query with its ``{{...}}`` placeholders filled in."""
    out = template
    for key, value in (
        ("namespace", namespace),
        ("name", name),
        ("revision", revision),
        ("interval", interval),
    ):
        out = out.replace("{{" + key + "}}", value).replace("{{ " + key + " }}", value)
    return out


class ScopeError(ValueError):
    """A query that could read outside its namespace, or that is not PromQL."""


def scoped(query: str, namespace: str) -> str:
    """``query`` as Prometheus should run it (the checked expression, rendered by the parser).

    Raises :class:`ScopeError` naming the first selector that is not limited to ``namespace``."""
    try:
        expr = pp.parse(query)
    except ValueError as e:
        raise ScopeError(f"not PromQL: {e}") from None
    unscoped: list[str] = []

    def visit(node: object) -> bool:
        if isinstance(node, pp.VectorSelector):
            if node.matchers.or_matchers:
                # checkable, but promql-parser 0.12 renders {a="1" or b="2"} wrongly ("{ or ...}")
                raise ScopeError(f"`or` inside a selector is not supported: {query}")
            if not _limited(list(node.matchers.matchers), namespace):
                unscoped.append(str(node))
        return True

    pp.walk(expr, visit)
    if unscoped:
        raise ScopeError(
            f'selector {unscoped[0]} may read other namespaces: every selector needs namespace="{namespace}"'
            ' (write namespace="{{namespace}}")'
        )
    rendered = str(expr)
    if str(pp.parse(rendered)) != rendered:  # what is sent must be what was checked
        raise ScopeError(f"cannot render the checked expression faithfully: {rendered}")
    return rendered


def _limited(matchers: list[pp.Matcher], namespace: str) -> bool:
    return any(m.name == "namespace" and m.op == pp.MatchOp.Equal and m.value == namespace for m in matchers)
