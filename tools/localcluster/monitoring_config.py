"""Prometheus' configuration: its command line and its pod scrape configuration."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

from .pki import KeyPair


def prometheus_args(bin_dir: Path, *, config: Path, data_dir: Path, port: int) -> list[str]:
    return [
        str(bin_dir / "prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address=0.0.0.0:{port}",  # host clients and pods (via the pod network's host end)
        "--storage.tsdb.retention.time=2h",
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]


def prometheus_config(
    *, apiserver: str, ca: Path, client: KeyPair, pod_cidr: str, scrape_interval: str = "1s"
) -> dict[str, Any]:
    """Scrape pods that carry the usual ``prometheus.io/*`` annotations, discovered from the apiserver.

    Only pods with an IP in ``pod_cidr`` (the process-run pods' /24) are kept: simulated pods have no
    process behind them and are never scraped.
    """
    net = ipaddress.ip_network(pod_cidr)
    if net.prefixlen != 24:
        raise ValueError(f"pod_cidr must be a /24, got {pod_cidr}")
    ip_regex = re.escape(str(net.network_address).rsplit(".", 1)[0] + ".") + r"\d+"
    k8s_tls = {"ca_file": str(ca), "cert_file": str(client.cert), "key_file": str(client.key)}
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                "scrape_timeout": scrape_interval,
                "kubernetes_sd_configs": [{"role": "pod", "api_server": apiserver, "tls_config": k8s_tls}],
                "relabel_configs": [
                    {
                        "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                        "action": "keep",
                        "regex": "true",
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_ip"],
                        "action": "keep",
                        "regex": ip_regex,
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_phase"],
                        "action": "keep",
                        "regex": "Running",
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
                        "action": "replace",
                        "target_label": "__metrics_path__",
                        "regex": "(.+)",
                    },
                    {
                        "source_labels": [
                            "__meta_kubernetes_pod_ip",
                            "__meta_kubernetes_pod_annotation_prometheus_io_port",
                        ],
                        "action": "replace",
                        "regex": r"(.+);(\d+)",
                        "replacement": "$1:$2",
                        "target_label": "__address__",
                    },
                    {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                ],
            }
        ],
    }
