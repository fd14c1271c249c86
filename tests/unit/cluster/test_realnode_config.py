"""The real node's configuration builders (localcluster.realnode_config, localcluster.nodeimages): pure,
no process started."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import tarfile
import tomllib
from pathlib import Path

import pytest
from localcluster import config, nodeimages, podnet
from localcluster import realnode_config as rc
from localcluster.pki import KeyPair

PATHS = rc.NodePaths(Path("/state"), Path("/cache/containerd"))
BIN = Path("/bin-dir")


def test_containerd_config_is_toml_with_the_settings_this_machine_needs() -> None:
    cfg = tomllib.loads(rc.to_toml(rc.containerd_config(PATHS, bin_dir=BIN)))
    assert cfg["version"] == 3
    assert cfg["root"] == "/cache/containerd" and cfg["state"] == "/state/node/containerd-state"
    assert cfg["grpc"]["address"] == "/state/node/containerd.sock"
    runtime = cfg["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True  # root lacks CAP_SYS_RESOURCE
    assert runtime["netns_mounts_under_state_dir"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"BinaryName": "/bin-dir/runc", "SystemdCgroup": False}
    assert runtime["cni"]["bin_dirs"] == ["/bin-dir/cni-bin"]
    assert runtime["cni"]["conf_dir"] == "/state/node/cni/net.d"
    assert cfg["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == rc.PAUSE_IMAGE
    assert "io.containerd.nri.v1.nri" in cfg["disabled_plugins"]


def test_to_toml_round_trips_nested_tables_and_quotes_dotted_keys() -> None:
    doc = {"a": 1, "b": {"c.d": {"e": ["x", "y"], "f": True}, "g": 'q"uote'}}
    assert tomllib.loads(rc.to_toml(doc)) == doc
    with pytest.raises(TypeError):
        rc.to_toml({"x": 1.5})


def test_kubelet_config_runs_on_cgroup_v1_without_touching_the_host_behind_our_back() -> None:
    cfg = rc.kubelet_config(
        PATHS,
        ca=Path("/pki/ca.crt"),
        serving_cert=Path("/pki/k.crt"),
        serving_key=Path("/pki/k.key"),
        node_ip="10.244.3.254",
        cluster_dns="10.244.3.254",
        resolv_conf=Path("/etc/netns/modeldeploy-3/resolv.conf"),
    )
    assert cfg["failCgroupV1"] is False and cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["protectKernelDefaults"] is True and cfg["oomScoreAdj"] == 0
    assert cfg["containerRuntimeEndpoint"] == "unix:///state/node/containerd.sock"
    assert cfg["address"] == "10.244.3.254" and cfg["readOnlyPort"] == 0
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["authentication"]["x509"]["clientCAFile"] == "/pki/ca.crt"
    assert cfg["authorization"]["mode"] == "Webhook"
    assert cfg["imageGCHighThresholdPercent"] == 100
    ev = cfg["evictionHard"]
    assert ev["nodefs.available"] == ev["imagefs.available"] == "500Mi"  # absolute: 1 % of a big disk is GBs
    assert ev["nodefs.inodesFree"] == ev["imagefs.inodesFree"] == "1%"
    assert cfg["clusterDNS"] == ["10.244.3.254"] and cfg["clusterDomain"] == "cluster.local"
    # nothing under /var/log or /usr/libexec: the pods' logs and volume plugins are the cluster's
    assert cfg["podLogsDir"].startswith("/state/") and cfg["volumePluginDir"].startswith("/state/")


def test_kubelet_args_name_labels_and_node_ip() -> None:
    args = rc.kubelet_args(
        BIN, PATHS, kubeconfig_path=Path("/k"), node_ip="10.244.3.254", labels={"b": "2", "a": "1"}
    )
    assert args[0] == "/bin-dir/kubelet"
    assert "--node-ip=10.244.3.254" in args and f"--hostname-override={rc.NODE_NAME}" in args
    assert "--node-labels=a=1,b=2" in args and "--root-dir=/state/node/kubelet" in args
    assert rc.netns_prefix("modeldeploy-3") == ["nsenter", "--net=/run/netns/modeldeploy-3", "--"]


@pytest.mark.parametrize("index", range(1, podnet.MAX_INDEX + 1))
def test_the_node_pod_range_is_disjoint_from_every_other_range(index: int) -> None:
    net = podnet.PodNetwork(index)
    mine = ipaddress.ip_network(rc.node_pod_cidr(index))
    assert mine.prefixlen == 24
    others = [net.agent_cidr, net.service_cidr]
    others += [podnet.PodNetwork(i).kwok_cidr for i in range(1, podnet.MAX_INDEX + 1)]
    others += [rc.node_pod_cidr(i) for i in range(1, podnet.MAX_INDEX + 1) if i != index]
    assert not any(mine.overlaps(ipaddress.ip_network(o)) for o in others)
    assert rc.bridge_ip(str(mine)) == str(mine[1])


def test_cni_conflist_bridges_with_host_local_state_in_the_cluster() -> None:
    conf = rc.cni_conflist(pod_cidr="10.245.3.0/24", ipam_dir=Path("/state/node/cni/ipam"))
    bridge, portmap = conf["plugins"]
    assert bridge["type"] == "bridge" and bridge["isGateway"] and bridge["hairpinMode"]
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.245.3.0/24", "gateway": "10.245.3.1"}]]
    assert bridge["ipam"]["dataDir"] == "/state/node/cni/ipam"
    assert portmap["backend"] == "nftables"


def test_sysctl_changes_name_only_what_differs() -> None:
    current = dict(rc.KUBELET_SYSCTLS) | {"kernel/panic": 1, "vm/overcommit_memory": 0}
    assert rc.sysctl_changes(current) == {"kernel/panic": (1, 10), "vm/overcommit_memory": (0, 1)}
    assert rc.sysctl_changes(dict(rc.KUBELET_SYSCTLS)) == {}


def test_the_apiserver_authorizes_nodes_only_with_a_real_kubelet() -> None:
    common = {
        "etcd_port": 1,
        "secure_port": 2,
        "ca": KeyPair(Path("/ca.crt"), Path("/ca.key")),
        "serving": KeyPair(Path("/s.crt"), Path("/s.key")),
        "sa": KeyPair(Path("/sa.pub"), Path("/sa.key")),
        "service_cidr": "10.96.1.0/24",
    }
    plain = config.apiserver_args(BIN, **common)  # type: ignore[arg-type]
    assert "--authorization-mode=RBAC" in plain and not any("kubelet" in a for a in plain)
    real = config.apiserver_args(BIN, **common, kubelet_client=KeyPair(Path("/k.crt"), Path("/k.key")))  # type: ignore[arg-type]
    assert "--authorization-mode=Node,RBAC" in real
    assert "--kubelet-client-certificate=/k.crt" in real and "--kubelet-certificate-authority=/ca.crt" in real


def test_kube_proxy_masquerades_all_only_when_asked() -> None:
    kw = {
        "kubeconfig_path": Path("/k"),
        "node_name": "n",
        "bind_ip": "1.2.3.4",
        "cluster_cidr": "c",
        "mode": "nftables",
    }
    assert "masqueradeAll" not in config.kube_proxy_config(**kw)  # type: ignore[arg-type]
    assert config.kube_proxy_config(**kw, masquerade_all=True)["masqueradeAll"] is True  # type: ignore[arg-type]


def test_parse_manifest_pairs_refs_with_archives() -> None:
    text = (
        "build-images: noise\n"
        "IMAGE_PAUSE_REF=docker.io/modeldeploy/pause:3.10\nIMAGE_PAUSE_ARCHIVE=/c/pause-1.tar\n"
        "IMAGE_OPERATOR_REF=docker.io/modeldeploy/operator:dev\n"
    )
    assert nodeimages.parse_manifest(text) == [
        nodeimages.ImageArchive("docker.io/modeldeploy/pause:3.10", Path("/c/pause-1.tar"))
    ]


def test_a_binary_image_is_an_oci_archive_whose_blobs_match_their_digests(tmp_path: Path) -> None:
    binary = tmp_path / "pause"
    binary.write_bytes(b"\x7fELF not really")
    out = tmp_path / "pause.tar"
    nodeimages.write_binary_image(binary, rc.PAUSE_IMAGE, out)
    index = nodeimages.archive_index(out)
    assert nodeimages.archive_ref(index) == rc.PAUSE_IMAGE
    with tarfile.open(out) as tar:
        for member in tar.getmembers():
            if member.name.startswith("blobs/sha256/"):
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                assert hashlib.sha256(data).hexdigest() == member.name.rsplit("/", 1)[1]
        digest = nodeimages.archive_digest(index).split(":")[1]
        manifest = json.load(tar.extractfile(f"blobs/sha256/{digest}"))  # type: ignore[arg-type]
    assert manifest["layers"][0]["mediaType"].endswith("tar+gzip")


def test_superseded_images_are_older_builds_of_our_repositories_only() -> None:
    from localcluster.nodeimages import superseded

    images = {
        "docker.io/modeldeploy/modelserver:dev": "sha256:new",
        "docker.io/modeldeploy/modelserver:old": "sha256:old",  # another tag of our repository, older
        "sha256:cfg-new": "sha256:new",  # the CRI's ID name of the current build: kept
        "sha256:cfg-old": "sha256:old",  # the ID name of the build the import replaced
        "docker.io/library/busybox:1": "sha256:other",  # not ours: left alone
        "docker.io/modeldeploy/pause:3.10": "sha256:pause",
    }
    current = {
        "docker.io/modeldeploy/modelserver:dev": "sha256:new",
        "docker.io/modeldeploy/pause:3.10": "sha256:pause",
    }
    assert superseded(images, current) == ["docker.io/modeldeploy/modelserver:old", "sha256:cfg-old"]
    images["sha256:cfg-busybox"] = "sha256:other"  # another image's ID name: kept with its tag
    assert "sha256:cfg-busybox" not in superseded(images, current)
    assert superseded(images, {}) == []  # nothing imported: every tag stays, and the IDs they name
