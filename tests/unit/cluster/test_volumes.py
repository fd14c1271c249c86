"""The node agent's downwardAPI volumes: fieldPath resolution, the kubelet's file format, the atomic writer,
and the pure parts of the mount helper."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from localcluster import podmount
from localcluster.volumes import (
    DATA_DIR,
    AtomicWriter,
    FileProjection,
    Mount,
    PodVolumes,
    VolumeError,
    container_mounts,
    downward_payload,
    field_value,
    format_map,
    go_quote,
    split_subscripted,
    wrap_command,
)


def _pod(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None, rv: int = 1) -> Any:
    return {
        "metadata": {
            "name": "web-0",
            "namespace": "ns1",
            "uid": "1234-abcd",
            "resourceVersion": str(rv),
            "annotations": annotations if annotations is not None else {"modeldeploy.io/shadow": "true"},
            "labels": labels if labels is not None else {"app": "web", "tier": "a"},
        },
        "spec": {
            "containers": [{"name": "c", "image": "modeldeploy/testapp:dev"}],
            "volumes": [
                {
                    "name": "podinfo",
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "shadow",
                                "fieldRef": {"fieldPath": "metadata.annotations['modeldeploy.io/shadow']"},
                            },
                            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                        ]
                    },
                },
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    }


# --- fieldPath and format --------------------------------------------------------------------------

# Expected values are Go's strconv.Quote of the same inputs (go 1.26, run once to produce this table).
GO_QUOTED = [
    ("plain", '"plain"'),
    ('a"b\\c', '"a\\"b\\\\c"'),
    ("line1\nline2\ttab\r", '"line1\\nline2\\ttab\\r"'),
    ("\x00\x07\x1b\x7f", '"\\x00\\a\\x1b\\x7f"'),
    ("é☺ 日本", '"é☺ 日本"'),
    ("\u00a0nbsp\u2028ls\u200bzw", '"\\u00a0nbsp\\u2028ls\\u200bzw"'),
    ("\U0001f600 emoji", '"\U0001f600 emoji"'),
    ("\ufeffbom", '"\\ufeffbom"'),
    ('{"k": [1, 2]}', '"{\\"k\\": [1, 2]}"'),
]


@pytest.mark.parametrize(("raw", "quoted"), GO_QUOTED)
def test_values_are_quoted_as_gos_percent_q(raw: str, quoted: str) -> None:
    assert go_quote(raw) == quoted


def test_maps_are_key_quoted_value_lines_sorted_without_a_trailing_newline() -> None:
    text = format_map({"zeta": "1", "alpha": 'say "hi"\n', "modeldeploy.io/shadow": "true"})
    assert text == 'alpha="say \\"hi\\"\\n"\nmodeldeploy.io/shadow="true"\nzeta="1"'
    assert format_map({}) == ""


@pytest.mark.parametrize(
    ("path", "want"),
    [
        (
            "metadata.annotations['modeldeploy.io/shadow']",
            ("metadata.annotations", "modeldeploy.io/shadow", True),
        ),
        ("metadata.annotations['a[b]c']", ("metadata.annotations", "a[b]c", True)),
        ("metadata.labels['']", ("metadata.labels", "", True)),
        ("metadata.labels", ("metadata.labels", "", False)),
        ("['x']", ("['x']", "", False)),
    ],
)
def test_subscripted_paths_split_like_the_kubelet(path: str, want: tuple[str, str, bool]) -> None:
    assert split_subscripted(path) == want


def test_field_paths_resolve_from_the_pod_object() -> None:
    pod = _pod()
    assert field_value(pod, "metadata.name") == "web-0"
    assert field_value(pod, "metadata.namespace") == "ns1"
    assert field_value(pod, "metadata.uid") == "1234-abcd"
    assert field_value(pod, "metadata.labels") == 'app="web"\ntier="a"'
    assert field_value(pod, "metadata.annotations") == 'modeldeploy.io/shadow="true"'
    assert field_value(pod, "metadata.labels['tier']") == "a"
    # The raw value, not quoted; a missing key is an empty file.
    assert field_value(pod, "metadata.annotations['modeldeploy.io/shadow']") == "true"
    assert field_value(pod, "metadata.annotations['missing']") == ""
    assert field_value(_pod(annotations={}, labels={}), "metadata.labels") == ""


@pytest.mark.parametrize(
    "path", ["status.podIP", "spec.nodeName", "metadata.name['x']", "metadata.generation"]
)
def test_unsupported_field_paths_are_refused(path: str) -> None:
    with pytest.raises(VolumeError):
        field_value(_pod(), path)


def test_payload_has_default_and_item_modes_and_refuses_resource_fields() -> None:
    source = {
        "defaultMode": 0o600,
        "items": [
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "dir/uid", "mode": 0o444, "fieldRef": {"fieldPath": "metadata.uid"}},
        ],
    }
    assert downward_payload(_pod(), source) == {
        "name": FileProjection(b"web-0", 0o600),
        "dir/uid": FileProjection(b"1234-abcd", 0o444),
    }
    with pytest.raises(VolumeError, match="resourceFieldRef"):
        downward_payload(_pod(), {"items": [{"path": "cpu", "resourceFieldRef": {"resource": "limits.cpu"}}]})
    for bad in ("/abs", "../up", "..data", "a/../../b", "."):
        with pytest.raises(VolumeError):
            downward_payload(_pod(), {"items": [{"path": bad, "fieldRef": {"fieldPath": "metadata.name"}}]})


# --- the atomic writer -----------------------------------------------------------------------------


def test_writer_makes_a_timestamped_dir_a_data_link_and_visible_links(tmp_path: Path) -> None:
    target = tmp_path / "vol"
    w = AtomicWriter(target)
    assert w.write({"shadow": FileProjection(b"true"), "sub/inner": FileProjection(b"x", 0o600)})
    ts = os.readlink(target / DATA_DIR)
    assert ts.startswith("..2") and (target / ts).is_dir() and not os.path.isabs(ts)
    assert os.readlink(target / "shadow") == "..data/shadow"
    assert os.readlink(target / "sub") == "..data/sub"
    assert (target / "shadow").read_text() == "true"
    assert (target / "sub" / "inner").read_text() == "x"
    assert (target / ts / "sub" / "inner").stat().st_mode & 0o777 == 0o600
    assert (target / ts / "shadow").stat().st_mode & 0o777 == 0o644
    assert sorted(os.listdir(target)) == sorted([DATA_DIR, ts, "shadow", "sub"])


def test_writer_swaps_the_data_link_and_removes_the_old_dir_and_stale_items(tmp_path: Path) -> None:
    target = tmp_path / "vol"
    w = AtomicWriter(target)
    w.write({"shadow": FileProjection(b"true"), "old": FileProjection(b"1")})
    first = os.readlink(target / DATA_DIR)
    assert w.write({"shadow": FileProjection(b"false")})
    second = os.readlink(target / DATA_DIR)
    assert second != first and not (target / first).exists()
    assert (target / "shadow").read_text() == "false"
    assert not os.path.lexists(target / "old")
    assert sorted(os.listdir(target)) == sorted([DATA_DIR, second, "shadow"])


def test_writer_leaves_an_unchanged_volume_alone(tmp_path: Path) -> None:
    target = tmp_path / "vol"
    w = AtomicWriter(target)
    w.write({"a": FileProjection(b"1")})
    before = os.readlink(target / DATA_DIR)
    assert not w.write({"a": FileProjection(b"1")})
    assert os.readlink(target / DATA_DIR) == before
    assert w.write({"a": FileProjection(b"1", 0o600)})  # a mode change is a change


def test_a_reader_never_sees_a_half_written_file(tmp_path: Path) -> None:
    target = tmp_path / "vol"
    w = AtomicWriter(target)
    contents = [bytes([65 + i]) * 200_000 for i in range(2)]
    w.write({"f": FileProjection(contents[0])})
    stop = threading.Event()
    seen: list[bytes] = []
    # A reader that resolved ..data to the old directory just before the writer removed it gets ENOENT
    # (the kubelet's atomic writer has the same window): counted, never a half-written file. Before, the
    # reader thread died on the first one and the test went on with what it had read until then.
    missing: list[int] = []

    def read() -> None:
        while not stop.is_set():
            try:
                seen.append((target / "f").read_bytes())
            except FileNotFoundError:
                missing.append(1)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(200):
            w.write({"f": FileProjection(contents[(i + 1) % 2])})
    finally:
        stop.set()
        reader.join()
    assert seen and all(s in contents for s in seen)
    assert {s[:1] for s in seen} == {b"A", b"B"}  # both versions were read while switching
    assert len(missing) < len(seen), (len(missing), len(seen))  # the window is rare, not the rule


def test_pod_volumes_follow_newer_pod_objects_only_and_are_removed(tmp_path: Path) -> None:
    vols = PodVolumes(_pod(rv=5), tmp_path / "volumes")
    assert vols.prepare() == {}
    shadow = tmp_path / "volumes" / "podinfo" / "shadow"
    assert shadow.read_text() == "true"
    assert (tmp_path / "volumes" / "podinfo" / "annotations").read_text() == 'modeldeploy.io/shadow="true"'
    vols.sync(_pod(annotations={"modeldeploy.io/shadow": "false"}, rv=7))
    assert shadow.read_text() == "false"
    vols.sync(_pod(annotations={"modeldeploy.io/shadow": "stale"}, rv=6))  # an older event, late
    assert shadow.read_text() == "false"
    vols.sync(_pod(annotations={}, rv=8))
    assert shadow.read_text() == ""
    assert (tmp_path / "volumes" / "podinfo" / "annotations").read_text() == ""
    assert (tmp_path / "volumes" / "tmp").is_dir()  # the emptyDir
    vols.remove()
    vols.sync(_pod(rv=9))
    assert not (tmp_path / "volumes").exists()


# --- mounts ----------------------------------------------------------------------------------------


def _container(*mounts: dict[str, Any]) -> dict[str, Any]:
    return {"name": "c", "image": "modeldeploy/testapp:dev", "volumeMounts": list(mounts)}


def test_container_mounts_take_provided_volumes_and_skip_others(tmp_path: Path) -> None:
    vols = PodVolumes(_pod(), tmp_path / "volumes")
    vols.prepare()
    mounts, skipped = container_mounts(
        _container(
            {"name": "podinfo", "mountPath": "/etc/modeldeploy/podinfo/"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ),
        vols,
        exists=lambda p: p in ("/", "/etc", "/tmp"),
    )
    assert mounts == [
        # downwardAPI volumes are read-only whatever the mount says, as the kubelet mounts them
        Mount(tmp_path / "volumes" / "podinfo", "/etc/modeldeploy/podinfo", True),
        Mount(tmp_path / "volumes" / "tmp", "/tmp", False),
    ]
    assert skipped == ["kube-api-access-x at /var/run/secrets/kubernetes.io/serviceaccount"]


@pytest.mark.parametrize(
    ("mount", "match"),
    [
        ({"name": "podinfo", "mountPath": "/etc/podinfo", "subPathExpr": "$(X)"}, "subPathExpr"),
        ({"name": "podinfo", "mountPath": "/etc/podinfo", "subPath": "../x"}, "invalid volume file path"),
        ({"name": "podinfo", "mountPath": "/etc/podinfo", "subPath": "missing"}, "does not exist"),
        ({"name": "podinfo", "mountPath": "/podinfo"}, "parent directory other than /"),
        ({"name": "podinfo", "mountPath": "relative/path"}, "mountPath"),
    ],
)
def test_mounts_the_agent_cannot_provide_are_refused(
    tmp_path: Path, mount: dict[str, Any], match: str
) -> None:
    vols = PodVolumes(_pod(), tmp_path / "volumes")
    vols.prepare()
    with pytest.raises(VolumeError, match=match):
        container_mounts(_container(mount), vols, exists=lambda p: p in ("/", "/etc"))


def test_a_volume_with_a_resource_field_refuses_its_containers(tmp_path: Path) -> None:
    pod = _pod()
    pod["spec"]["volumes"][0]["downwardAPI"]["items"].append(
        {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}}
    )
    vols = PodVolumes(pod, tmp_path / "volumes")
    assert "resourceFieldRef" in vols.prepare()["podinfo"]
    assert not vols.ready
    with pytest.raises(VolumeError, match="resourceFieldRef"):
        container_mounts(_container({"name": "podinfo", "mountPath": "/etc/x"}), vols)
    # A container not mounting it is not affected.
    assert container_mounts(_container(), vols) == ([], [])


def test_wrap_command_starts_the_container_through_the_mount_helper(tmp_path: Path) -> None:
    argv = ["ip", "netns", "exec", "modeldeploy-1", "python", "-m", "x"]
    assert wrap_command(argv, [], tmp_path) == argv
    cmd = wrap_command(argv, [Mount(Path("/s/podinfo"), "/etc/podinfo", True)], tmp_path / "mnt")
    assert cmd[:4] == ["unshare", "--mount", "--propagation", "private"]
    i = cmd.index("--")
    assert cmd[i + 1 :] == argv
    scratch, binds, command, keep = podmount.parse(cmd[cmd.index("localcluster.podmount") + 1 :])
    assert (scratch, binds, command) == (tmp_path / "mnt", [("/s/podinfo", "/etc/podinfo", True)], argv)
    assert keep == []
    cmd = wrap_command(argv, [Mount(Path("/s/t"), "/tmp", False)], tmp_path, keep=["/tmp/repo", "/opt/venv"])
    _, _, _, keep = podmount.parse(cmd[cmd.index("localcluster.podmount") + 1 :])
    assert keep == ["/tmp/repo", "/opt/venv"]


def test_mountinfo_mount_points_are_unescaped() -> None:
    info = (
        "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
        "40 27 0:30 / /etc/with\\040space rw - tmpfs tmpfs rw\n"
        "41 27 0:31 / /back\\134slash rw - tmpfs tmpfs rw\n"
    )
    assert podmount.mount_points(info) == ["/proc", "/etc/with space", "/back\\slash"]


def test_top_submounts_are_the_outermost_mounts_below_a_directory() -> None:
    points = [
        "/",
        "/etc",
        "/etc/hosts",
        "/etc/ssl",
        "/etc/ssl/certs",
        "/etcetera",
        "/x/scratch",
        "/x/scratch/0",
    ]
    assert podmount.top_submounts(points, "/etc", exclude="/x/scratch") == ["/etc/hosts", "/etc/ssl"]
    assert podmount.top_submounts(points, "/", exclude="/x/scratch") == ["/etc", "/etcetera"]
