"""The node agent's emptyDir, hostPath, persistentVolumeClaim, configMap and secret volumes (pure parts:
the API is a dictionary), subPath sources and the paths bound back over a covering mount."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from localcluster import podmount
from localcluster.state import REPO_ROOT
from localcluster.volumes import (
    Mount,
    PodVolumes,
    VolumeError,
    container_mounts,
    keep_paths,
    keyed_payload,
    persistent_volume_path,
    prepare_host_path,
)


def _pod(*volumes: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns1", "uid": "u", "resourceVersion": "1"},
        "spec": {"containers": [{"name": "c", "image": "modeldeploy/testapp:dev"}], "volumes": list(volumes)},
    }


def _api(objects: dict[str, dict[str, Any]]) -> Any:
    return lambda path: objects.get(path)


def _mounts(vols: PodVolumes, *mounts: dict[str, Any]) -> list[Mount]:
    container = {"name": "c", "volumeMounts": list(mounts)}
    return container_mounts(container, vols, exists=lambda p: p in ("/", "/mnt", "/etc"))[0]


# --- emptyDir --------------------------------------------------------------------------------------


def test_an_empty_dir_is_a_directory_of_the_pod_removed_with_it(tmp_path: Path) -> None:
    vols = PodVolumes(_pod({"name": "models", "emptyDir": {"sizeLimit": "1Gi"}}), tmp_path / "volumes")
    assert vols.prepare() == {}
    d = tmp_path / "volumes" / "models"
    assert d.is_dir() and stat.S_IMODE(d.stat().st_mode) == 0o777
    (d / "weights.bin").write_bytes(b"x")
    assert _mounts(vols, {"name": "models", "mountPath": "/mnt/models"}) == [Mount(d, "/mnt/models", False)]
    assert _mounts(vols, {"name": "models", "mountPath": "/mnt/models", "readOnly": True}) == [
        Mount(d, "/mnt/models", True)
    ]
    vols.remove()
    assert not d.exists()


def test_a_sub_path_of_a_writable_volume_is_created_like_the_kubelet_does(tmp_path: Path) -> None:
    vols = PodVolumes(_pod({"name": "scratch", "emptyDir": {}}), tmp_path / "volumes")
    vols.prepare()
    (m,) = _mounts(vols, {"name": "scratch", "mountPath": "/mnt/a", "subPath": "x/y"})
    assert m.source == tmp_path / "volumes" / "scratch" / "x" / "y" and m.source.is_dir()
    os.symlink("/etc", tmp_path / "volumes" / "scratch" / "escape")
    with pytest.raises(VolumeError, match="leaves the volume"):
        _mounts(vols, {"name": "scratch", "mountPath": "/mnt/b", "subPath": "escape"})


# --- hostPath --------------------------------------------------------------------------------------


def test_host_path_types_are_checked_and_created_like_the_kubelets(tmp_path: Path) -> None:
    d = tmp_path / "cache" / "models"
    assert prepare_host_path(str(d), "DirectoryOrCreate") == d and d.is_dir()
    assert stat.S_IMODE(d.stat().st_mode) == 0o755
    assert prepare_host_path(str(d), "Directory") == d
    assert prepare_host_path(str(d), "") == d
    with pytest.raises(VolumeError, match="is not a directory"):
        prepare_host_path(str(tmp_path / "missing"), "Directory")
    with pytest.raises(VolumeError, match="does not exist"):
        prepare_host_path(str(tmp_path / "missing"), "")
    f = tmp_path / "cache" / "lock"
    assert prepare_host_path(str(f), "FileOrCreate") == f and f.is_file()
    assert prepare_host_path(str(f), "File") == f
    with pytest.raises(VolumeError, match="is not a file"):
        prepare_host_path(str(d), "File")
    with pytest.raises(VolumeError, match="is not a socket"):
        prepare_host_path(str(f), "Socket")
    with pytest.raises(VolumeError, match="is not a directory"):
        prepare_host_path(str(tmp_path / "no" / "parent"), "FileOrCreate")
    with pytest.raises(VolumeError, match="not absolute"):
        prepare_host_path("relative", "DirectoryOrCreate")


def test_a_host_path_volume_is_the_hosts_directory_and_outlives_the_pod(tmp_path: Path) -> None:
    host = tmp_path / "node-cache"
    pod = _pod({"name": "cache", "hostPath": {"path": str(host), "type": "DirectoryOrCreate"}})
    vols = PodVolumes(pod, tmp_path / "volumes")
    assert vols.prepare() == {}
    assert _mounts(vols, {"name": "cache", "mountPath": "/mnt/cache"}) == [Mount(host, "/mnt/cache", False)]
    (host / "entry").write_text("kept")
    vols.remove()
    assert (host / "entry").read_text() == "kept"


def test_a_missing_host_path_is_an_error_until_it_appears(tmp_path: Path) -> None:
    host = tmp_path / "later"
    vols = PodVolumes(
        _pod({"name": "d", "hostPath": {"path": str(host), "type": "Directory"}}), tmp_path / "v"
    )
    assert "is not a directory" in vols.prepare()["d"]
    host.mkdir()
    assert vols.prepare() == {} and vols.ready


# --- persistentVolumeClaim -------------------------------------------------------------------------


def _claim(phase: str = "Bound", volume: str = "pv-models") -> dict[str, Any]:
    return {"spec": {"volumeName": volume}, "status": {"phase": phase}}


def _pv(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "pv-models"}, "spec": spec}


CLAIM = "/api/v1/namespaces/ns1/persistentvolumeclaims/models"
PV = "/api/v1/persistentvolumes/pv-models"


def test_a_claim_mounts_its_bound_local_or_host_path_volume(tmp_path: Path) -> None:
    data = tmp_path / "pv"
    data.mkdir()
    for pv in (_pv(local={"path": str(data)}), _pv(hostPath={"path": str(data), "type": "Directory"})):
        vols = PodVolumes(
            _pod({"name": "m", "persistentVolumeClaim": {"claimName": "models"}}),
            tmp_path / "volumes",
            lookup=_api({CLAIM: _claim(), PV: pv}),
        )
        assert vols.prepare() == {}
        assert _mounts(vols, {"name": "m", "mountPath": "/mnt/pvc"}) == [Mount(data, "/mnt/pvc", False)]


def test_a_read_only_claim_makes_every_mount_read_only(tmp_path: Path) -> None:
    data = tmp_path / "pv"
    data.mkdir()
    vols = PodVolumes(
        _pod({"name": "m", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}),
        tmp_path / "volumes",
        lookup=_api({CLAIM: _claim(), PV: _pv(local={"path": str(data)})}),
    )
    vols.prepare()
    assert _mounts(vols, {"name": "m", "mountPath": "/mnt/pvc", "readOnly": False}) == [
        Mount(data, "/mnt/pvc", True)
    ]


@pytest.mark.parametrize(
    ("objects", "match"),
    [
        ({}, 'persistentvolumeclaim "models" not found'),
        ({CLAIM: _claim(phase="Pending")}, "is not bound"),
        ({CLAIM: _claim()}, 'persistentvolume "pv-models"'),
        ({CLAIM: _claim(), PV: _pv(nfs={"server": "x", "path": "/"})}, "only hostPath and local"),
    ],
)
def test_a_claim_that_cannot_be_mounted_says_why(tmp_path: Path, objects: dict[str, Any], match: str) -> None:
    vols = PodVolumes(
        _pod({"name": "m", "persistentVolumeClaim": {"claimName": "models"}}),
        tmp_path / "volumes",
        lookup=_api(objects),
    )
    assert match in vols.prepare()["m"]


def test_persistent_volume_paths() -> None:
    assert persistent_volume_path(_pv(local={"path": "/d"})) == ("/d", "Directory")
    assert persistent_volume_path(_pv(hostPath={"path": "/h"})) == ("/h", "")
    assert persistent_volume_path(_pv(hostPath={"path": "/h", "type": "DirectoryOrCreate"})) == (
        "/h",
        "DirectoryOrCreate",
    )


# --- configMap and secret --------------------------------------------------------------------------


CM = {
    "data": {"a.json": '{"x": 1}', "b": "two"},
    "binaryData": {"bin": base64.b64encode(b"\x00\x01").decode()},
}


def test_config_map_payload_keys_items_modes_and_optional() -> None:
    all_keys = keyed_payload("ConfigMap", "cm", CM, {})
    assert {k: v.data for k, v in all_keys.items()} == {
        "a.json": b'{"x": 1}',
        "b": b"two",
        "bin": b"\x00\x01",
    }
    assert {v.mode for v in all_keys.values()} == {0o644}
    picked = keyed_payload(
        "ConfigMap",
        "cm",
        CM,
        {"defaultMode": 0o600, "items": [{"key": "b", "path": "d/b.txt", "mode": 0o400}]},
    )
    assert list(picked) == ["d/b.txt"] and picked["d/b.txt"].mode == 0o400
    with pytest.raises(VolumeError, match="non-existent config key: nope"):
        keyed_payload("ConfigMap", "cm", CM, {"items": [{"key": "nope", "path": "n"}]})
    assert (
        keyed_payload("ConfigMap", "cm", CM, {"optional": True, "items": [{"key": "nope", "path": "n"}]})
        == {}
    )
    with pytest.raises(VolumeError, match='configmap "cm" not found'):
        keyed_payload("ConfigMap", "cm", None, {})
    assert keyed_payload("ConfigMap", "cm", None, {"optional": True}) == {}


def test_secret_payload_is_decoded() -> None:
    sec = {"data": {"AWS_ACCESS_KEY_ID": base64.b64encode(b"AK").decode()}}
    assert keyed_payload("Secret", "s", sec, {})["AWS_ACCESS_KEY_ID"].data == b"AK"
    with pytest.raises(VolumeError, match='secret "s" not found'):
        keyed_payload("Secret", "s", None, {})


def test_config_map_volumes_are_written_atomically_read_only_and_refreshed(tmp_path: Path) -> None:
    objects = {"/api/v1/namespaces/ns1/configmaps/cm": {"data": {"k": "v1"}}}
    vols = PodVolumes(_pod({"name": "cfg", "configMap": {"name": "cm"}}), tmp_path / "volumes", _api(objects))
    assert vols.prepare() == {}
    d = tmp_path / "volumes" / "cfg"
    assert (d / "k").read_text() == "v1" and os.readlink(d / "k") == "..data/k"
    assert _mounts(vols, {"name": "cfg", "mountPath": "/etc/cfg"}) == [Mount(d, "/etc/cfg", True)]
    objects["/api/v1/namespaces/ns1/configmaps/cm"] = {"data": {"k": "v2"}}
    vols.refresh()
    assert (d / "k").read_text() == "v2"
    # a subPath of such a volume is the item's current file, a snapshot
    (m,) = _mounts(vols, {"name": "cfg", "mountPath": "/etc/k.conf", "subPath": "k"})
    assert m.source.read_text() == "v2" and m.source.parent.name.startswith("..2") and m.read_only


def test_a_missing_config_map_waits_and_other_types_are_skipped(tmp_path: Path) -> None:
    objects: dict[str, Any] = {}
    pod = _pod({"name": "cfg", "configMap": {"name": "cm"}}, {"name": "tok", "projected": {"sources": []}})
    vols = PodVolumes(pod, tmp_path / "volumes", _api(objects))
    assert vols.skipped == {"tok": "projected"}
    assert vols.prepare() == {"cfg": 'configmap "cm" not found'}
    objects["/api/v1/namespaces/ns1/configmaps/cm"] = {"data": {}}
    assert vols.prepare() == {}


# --- what a covering mount must keep -----------------------------------------------------------------


def test_keep_paths_hold_the_repository_and_the_python_environment(tmp_path: Path) -> None:
    keep = keep_paths([tmp_path])
    assert os.path.realpath(REPO_ROOT) in keep and os.path.realpath(tmp_path) in keep
    assert "/" not in keep


def test_only_the_outermost_kept_paths_below_a_mount_are_bound_back() -> None:
    keep = ["/tmp/ci/repo", "/tmp/ci/repo/.venv", "/tmp/pytest/cluster0", "/usr", "/tmpx/y"]
    assert podmount.covered_keeps(keep, "/tmp") == ["/tmp/ci/repo", "/tmp/pytest/cluster0"]
    assert podmount.covered_keeps(keep, "/tmp/ci/repo") == ["/tmp/ci/repo/.venv"]
    assert podmount.covered_keeps(keep, "/mnt/models") == []
