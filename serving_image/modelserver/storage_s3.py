"""S3 (and S3-compatible stores) for the model fetch: settings, listing, parallel download, checksums.

This module is the facade the fetch imports; each job has a module of its own: :mod:`.s3_client` (URI,
settings, client), :mod:`.s3_errors` (error mapping), :mod:`.s3_listing`, :mod:`.fetch_progress`,
:mod:`.s3_plan` (how each object is fetched and checked), :mod:`.s3_stream` (checks while streaming),
:mod:`.s3_verify` (checks by reading a file again) and :mod:`.s3_transfer` (the download).

Settings come from the environment, with KServe's names:

* ``S3_ENDPOINT``: ``host[:port]`` or a URL (``http(s)://host[:port]``); unset: AWS S3 (or boto3's own
  ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``).
* ``S3_USE_HTTPS``: ``1``/``0`` (default ``1``); the scheme of an ``S3_ENDPOINT`` without one.
* ``S3_VERIFY_SSL``: ``0`` turns TLS certificate verification off (default ``1``).
* ``AWS_CA_BUNDLE``: a PEM file of CAs to trust for the endpoint.
* ``AWS_DEFAULT_REGION`` (or ``AWS_REGION``): default ``us-east-1``.
* ``S3_ADDRESSING_STYLE``: ``path``, ``virtual`` or ``auto`` (default): with ``S3_ENDPOINT`` set, ``auto``
  means ``path`` (what S3-compatible stores serve); against AWS, botocore's own choice.
* credentials: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``) or anything else of
  boto3's chain; none at all: unsigned (anonymous) requests. The EC2 instance metadata service is not asked
  unless ``AWS_EC2_METADATA_DISABLED=false`` is set.

``s3://bucket/key`` is one object when ``key`` names an object, else the prefix ``key/`` (a directory);
``s3://bucket/key/`` and ``s3://bucket`` are always prefixes. A prefix's objects keep their paths below the
prefix; "directory marker" objects (keys ending in ``/``) are skipped.
"""

from __future__ import annotations

from .fetch_progress import Progress, human
from .s3_client import ClientOptions, S3Location, S3Settings, make_client, parse_s3_uri
from .s3_errors import map_error
from .s3_listing import MAX_OBJECTS, Listing, RemoteObject, resolve
from .s3_plan import MiB, Plan, TransferOptions
from .s3_stream import StreamHashes
from .s3_transfer import download
from .s3_verify import FileDigest, dir_digest_of, hash_file, is_md5, verify_file

__all__ = [
    "MAX_OBJECTS",
    "ClientOptions",
    "FileDigest",
    "Listing",
    "MiB",
    "Plan",
    "Progress",
    "RemoteObject",
    "S3Location",
    "S3Settings",
    "StreamHashes",
    "TransferOptions",
    "dir_digest_of",
    "download",
    "hash_file",
    "human",
    "is_md5",
    "make_client",
    "map_error",
    "parse_s3_uri",
    "resolve",
    "verify_file",
]
