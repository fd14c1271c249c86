"""The object store's pure parts: versitygw's access-log lines, the credentials and the command line."""

from __future__ import annotations

import json
from pathlib import Path

from localcluster import config
from localcluster.cluster import s3_credentials
from localcluster.objectstore import ObjectStore, parse_access_log, parse_access_log_line

UA = (
    "Boto3/1.44.8 md/Botocore#1.44.8 ua/2.1 os/linux#6.18.44 md/arch#x86_64 lang/python#3.11.7 "
    "md/pyimpl#CPython m/b,Z,N,E,e cfg/retry-mode#standard Botocore/1.44.8"
)
TAIL = "- HOSTID= SigV4 - AuthHeader s3.us-east-1.amazonaws.com - arn:aws:s3:::/models/a/b.txt Yes"

# Lines as versitygw v1.8.0 wrote them (user agent shortened, host ids replaced): each head, then the
# unquoted user agent and the tail.
T = "[01/December/2026:01:17:28 +0000]"
HEADS = [
    f"ak models {T} 10.244.1.1 ak BJ8OGYABH0OOCKFW s3_CreateBucket - /models 200 - 0 0 0 0 -",
    f"ak models {T} 10.244.1.1 ak 5VU6T9M74CIRI412 s3_PutObject a/b.txt /models/a/b.txt 200 - 0 5000 1 1 -",
    f"ak models {T} 10.244.1.254 ak RVCSUUX2KUZ771OR s3_GetObject a/b.txt /models/a/b.txt 200 - 0 0 0 0 -",
    f"ak models {T} 10.244.1.254 ak 64ITF8HFUUZMKS2I s3_ListObjectsV2 - /models?list-type=2&prefix=a%2F"
    " 200 - 491 0 0 0 -",
    f"- - {T} 10.244.1.1 ak 56WLONVH3LG4ILN2 s3_ListAllMyBuckets - / 403 SignatureDoesNotMatch 0 0 0 0 -",
    f"ak models {T} 10.244.1.254 ak QQ s3_GetObject dir with space/x.bin"
    " /models/dir%20with%20space/x.bin 404 NoSuchKey 0 0 0 0 -",
]
LOG = "log starts 2026-12-01 01:17:19.643845902 +0000 UTC m=+0.021632551\n" + "".join(
    f"{h} {UA} {TAIL}\n" for h in HEADS
)


def test_access_log_lines_parse_into_requests() -> None:
    entries = parse_access_log(LOG)
    assert [e.action for e in entries] == [
        "CreateBucket",
        "PutObject",
        "GetObject",
        "ListObjectsV2",
        "ListAllMyBuckets",
        "GetObject",
    ]
    get = entries[2]
    assert (get.bucket, get.key, get.uri, get.status, get.error, get.remote_ip, get.requester) == (
        "models",
        "a/b.txt",
        "/models/a/b.txt",
        200,
        "",
        "10.244.1.254",
        "ak",
    )
    assert entries[3].key == "" and entries[3].uri == "/models?list-type=2&prefix=a%2F"
    refused = entries[4]
    assert (refused.bucket, refused.status, refused.error) == ("", 403, "SignatureDoesNotMatch")
    assert entries[5].key == "dir with space/x.bin" and entries[5].status == 404
    assert parse_access_log_line("log starts 2026-12-01") is None
    assert parse_access_log_line("") is None


def test_count_filters_by_action_bucket_prefix_status_and_offset(tmp_path: Path) -> None:
    log = tmp_path / "s3-access.log"
    log.write_text(LOG)
    store = ObjectStore("http://10.244.1.254:9000", "ak", "sk", log)
    assert store.count("GetObject") == 1  # the 404 is not counted by default
    assert store.count("GetObject", status=None) == 2
    assert store.count("GetObject", bucket="models", key_prefix="a/") == 1
    assert store.count("GetObject", key_prefix="b/") == 0
    assert store.count("GetObject", remote_ip="10.244.1.1") == 0
    offset = store.log_offset()
    assert store.count("PutObject", since=offset) == 0
    with open(log, "a") as f:
        f.write(LOG.splitlines()[2] + "\n")
    assert store.count("PutObject", since=offset) == 1 and store.count("PutObject") == 2


def test_the_store_is_read_from_the_state_directory(tmp_path: Path) -> None:
    (tmp_path / "s3-url").write_text("http://10.244.3.254:9000\n")
    (tmp_path / "s3-credentials.json").write_text(json.dumps({"accessKey": "AK", "secretKey": "SK"}))
    store = ObjectStore.of_state_dir(tmp_path)
    assert (store.url, store.access_key, store.secret_key) == ("http://10.244.3.254:9000", "AK", "SK")
    assert store.access_log == tmp_path / "logs" / "s3-access.log"


def test_credentials_are_fresh_and_aws_shaped() -> None:
    a, b = s3_credentials(), s3_credentials()
    assert a != b
    assert len(a["accessKey"]) == 20 and a["accessKey"].startswith("LOCAL") and a["accessKey"].isalnum()
    assert len(a["secretKey"]) == 40


def test_versitygw_listens_on_the_anchor_with_an_access_log_and_no_secret_on_its_command_line(
    tmp_path: Path,
) -> None:
    argv = config.versitygw_args(
        tmp_path, listen_ip="10.244.3.254", data_dir=tmp_path / "data", access_log=tmp_path / "a.log"
    )
    assert argv[0] == str(tmp_path / "versitygw")
    assert "--port=10.244.3.254:9000" in argv and f"--access-log={tmp_path / 'a.log'}" in argv
    assert argv[-2:] == ["posix", str(tmp_path / "data")]
    assert not any(a.startswith(("--access=", "--secret=", "-a", "-s")) for a in argv)
