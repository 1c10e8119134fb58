"""The environment cache's object stores, spoken over plain HTTP with the standard library.

::

    bootstrap script (sh) ── python3 store.py fetch|probe|publish ──> S3 / GCS / Azure Blob
    skyward cache ls|prune (client) ── Store.list / delete ─────────> the same

This one file runs on both sides of the wire: the bootstrap carries it to a node as text and
runs it with whatever ``python3`` the node has (3.8 or newer; no packages: it must work
before uv and the package index, and a node that downloads its environment asks the index
for nothing), and the client imports it for ``skyward cache``. That is why it signs its
requests itself (SigV4 for S3, Shared Key or a bearer token for Azure, a bearer token for
GCS) rather than using boto3, google-cloud-storage or azure-storage-blob: those would have
to come from the package index onto every node first.

Credentials, on a node, come from the node: the store's usual variables in its own
environment when a user set them there (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
[/``AWS_SESSION_TOKEN``]; ``CLOUDSDK_AUTH_ACCESS_TOKEN``; ``AZURE_STORAGE_KEY`` or
``AZURE_STORAGE_SAS_TOKEN``), else the machine's identity from its metadata service (an EC2
instance profile through IMDSv2, a GCE service account, an Azure managed identity). The
client never sends one. With an endpoint (an emulator) and no credential at all, GCS is
asked anonymously.

An entry is one object, ``<prefix>/<image digest>/<platform>-<python>.tar.zst``: a tar of
the environment (and the uv-managed CPython it was made from, if any), relative to the
bootstrap's workdir, compressed with the ``zstd`` command. Its metadata records the
SHA-256 of the object, the workdir it was built in (to relocate it) and the pool's tags.
A download is parallel ranged GETs written in order into ``zstd -d | tar -x`` in a scratch
directory, hashed as it goes; only when the hash matches the recorded one is the scratch
moved into place. Anything else (absent, short, another hash, a failing unpacker) is a miss,
and the node builds as if there were no cache.
"""

from __future__ import annotations

import base64
import builtins
import collections
import datetime
import hashlib
import hmac
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any, NamedTuple

# Exit statuses the bootstrap script reads.
HIT, MISS, UNWRITABLE, NO_TOOLS = 0, 10, 11, 12

CHUNK = 16 << 20  # bytes per ranged GET (S3's guidelines: 8-16 MB ranges)
# The first ranges are smaller (1, 2, 4, 8 MB, then CHUNK): the unpacker, which needs the
# bytes in order, starts on the first MB at once instead of when the first 16 MB range
# arrives with the 7 others sharing the link, which serialized most of the download and
# the unpacking.
FIRST_CHUNK = 1 << 20
WORKERS = 8  # ranged GETs in flight
_TIMEOUT = 60.0  # seconds for one request
_METADATA_TIMEOUT = 2.0  # a metadata service answers at once where there is one
# Metadata names: Azure's must be identifiers (no '-'), the others accept these as they are.
SHA256, HOME, CREATED = "skyward_sha256", "skyward_home", "skyward_created"


class StoreError(Exception):
    """A request the store refused or that did not arrive (status 0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Entry(NamedTuple):
    key: str
    size: int
    modified: float  # seconds since the epoch
    metadata: dict[str, str]


def parse(url: str) -> tuple[str, str, str, str]:
    """``s3://bucket/prefix`` -> ("s3", "bucket", "", "prefix"); ``az://account/container/
    prefix`` -> ("az", "account", "container", "prefix"). (``Image`` validated it.)"""
    scheme, _, rest = url.partition("://")
    parts = [p for p in rest.strip("/").split("/") if p]
    if scheme == "az":
        return scheme, parts[0], parts[1], "/".join(parts[2:])
    return scheme, parts[0], "", "/".join(parts[1:])


def _request(
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes | _Body | None = None,
    ok: tuple[int, ...] = (200, 201, 204, 206),
    timeout: float = _TIMEOUT,
) -> tuple[int, dict[str, str], bytes]:
    if body is not None and not any(k.lower() == "content-type" for k in headers):
        # urllib would send form-encoding's type, and a server may parse the body as a form.
        headers = {**headers, "Content-Type": "application/octet-stream"}
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, answer.read()
    except urllib.error.HTTPError as error:
        data = error.read()
        found = {k.lower(): v for k, v in error.headers.items()}
        if error.code in ok:
            return error.code, found, data
        text = data.decode("utf-8", "replace")[:300]
        raise StoreError(
            f"{method} {url.split('?')[0]}: HTTP {error.code} {text}", error.code
        ) from None
    except (urllib.error.URLError, OSError) as error:
        raise StoreError(f"{method} {url.split('?')[0]}: {error}") from error


class _Body:
    """A request body read from parts (bytes, or a file from an offset), for uploads that
    are not held in memory; http.client sends anything with ``read``."""

    def __init__(self, parts: list[object]) -> None:
        self._parts = collections.deque(parts)
        self._file: IO[bytes] | None = None

    def read(self, size: int = -1) -> bytes:
        while self._parts or self._file is not None:
            if self._file is not None:
                data = self._file.read(size if size > 0 else CHUNK)
                if data:
                    return data
                self._file.close()
                self._file = None
                continue
            part = self._parts.popleft()
            if isinstance(part, bytes):
                if part:
                    return part
                continue
            self._file = open(str(part), "rb")  # noqa: SIM115 - closed when read out
        return b""


class Store:
    """One store's calls. Keys are full object names (the prefix included)."""

    def head(self, key: str) -> Entry | None:
        raise NotImplementedError

    def get(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive)."""
        raise NotImplementedError

    def put(self, key: str, path: str, metadata: dict[str, str], tags: dict[str, str]) -> None:
        raise NotImplementedError

    def put_bytes(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def list(self, prefix: str) -> Iterator[Entry]:
        raise NotImplementedError


def _imds_token() -> str:
    _, _, token = _request(
        "PUT",
        "http://169.254.169.254/latest/api/token",
        {"X-aws-ec2-metadata-token-ttl-seconds": "21600"},
        timeout=_METADATA_TIMEOUT,
    )
    return token.decode()


def _iso8601(text: str) -> float:
    text = text.replace("Z", "+00:00")
    if "." in text:  # fromisoformat before 3.11 takes 3 or 6 digits only
        head, _, tail = text.partition(".")
        digits = tail[: len(tail) - len(tail.lstrip("0123456789"))]
        text = f"{head}.{digits[:6].ljust(6, '0')}{tail[len(digits) :]}"
    return datetime.datetime.fromisoformat(text).timestamp()


def _http_date(text: str) -> float:
    from email.utils import parsedate_to_datetime

    return parsedate_to_datetime(text).timestamp()


# ── S3 ─────────────────────────────────────────────────────────────────────────────────


class S3(Store):
    """S3 with SigV4: path-style at an endpoint, virtual-hosted on AWS. Credentials from
    the environment, else the instance profile (IMDSv2); a wrong region is corrected once
    from the answer's ``x-amz-bucket-region``."""

    def __init__(
        self,
        bucket: str,
        endpoint: str | None,
        credentials: tuple[str, str, str | None] | None = None,
    ) -> None:
        self.bucket, self.endpoint = bucket, endpoint
        self.region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or ""
        self._credentials = credentials
        self._expires = float("inf")
        self._lock = threading.Lock()  # guards: _credentials, _expires

    def _keys(self) -> tuple[str, str, str | None]:
        with self._lock:
            if self._credentials is None or time.time() > self._expires - 300:
                key, secret = (
                    os.environ.get("AWS_ACCESS_KEY_ID"),
                    os.environ.get("AWS_SECRET_ACCESS_KEY"),
                )
                if key and secret:
                    self._credentials = (key, secret, os.environ.get("AWS_SESSION_TOKEN"))
                else:
                    self._credentials = self._instance_profile()
            return self._credentials

    def _instance_profile(self) -> tuple[str, str, str | None]:
        base = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
        try:
            token = {"X-aws-ec2-metadata-token": _imds_token()}
            _, _, role = _request("GET", base, token, timeout=_METADATA_TIMEOUT)
            name = role.decode().split()[0]
            _, _, blob = _request("GET", base + name, token, timeout=_METADATA_TIMEOUT)
        except (StoreError, IndexError) as error:
            raise StoreError(
                f"no AWS credentials: none in the environment, and no instance profile ({error})"
            ) from error
        found = json.loads(blob)
        self._expires = _iso8601(found["Expiration"])
        if not self.region:
            try:
                _, _, region = _request(
                    "GET",
                    "http://169.254.169.254/latest/meta-data/placement/region",
                    token,
                    timeout=_METADATA_TIMEOUT,
                )
                self.region = region.decode().strip()
            except StoreError:
                pass
        return found["AccessKeyId"], found["SecretAccessKey"], found.get("Token")

    def _url(self, key: str, query: str = "") -> str:
        path = urllib.parse.quote(key, safe="/~-_.")
        q = f"?{query}" if query else ""
        if self.endpoint:
            return f"{self.endpoint}/{self.bucket}/{path}{q}"
        region = self.region or "us-east-1"
        return f"https://{self.bucket}.s3.{region}.amazonaws.com/{path}{q}"

    def _call(
        self,
        method: str,
        key: str,
        query: dict[str, str],
        headers: dict[str, str],
        body: bytes | _Body | None = None,
        ok: tuple[int, ...] = (200, 201, 204, 206),
    ) -> tuple[int, dict[str, str], bytes]:
        for attempt in (0, 1):
            encoded = "&".join(
                f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                for k, v in sorted(query.items())
            )
            url = self._url(key, encoded)
            signed = self._sign(method, url, encoded, dict(headers))
            try:
                return _request(method, url, signed, body, ok)
            except StoreError as error:
                # A bucket in another region: AWS names it; ask there, once.
                moved = re.search(r"<Region>([a-z0-9-]+)</Region>", str(error))
                if attempt == 0 and error.status in (301, 400) and moved and not self.endpoint:
                    self.region = moved.group(1)
                    continue
                raise
        raise AssertionError("unreachable")

    def _sign(self, method: str, url: str, query: str, headers: dict[str, str]) -> dict[str, str]:
        key, secret, token = self._keys()
        region = self.region or "us-east-1"
        parts = urllib.parse.urlsplit(url)
        now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        headers["host"] = parts.netloc
        headers["x-amz-date"] = now
        headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
        if token:
            headers["x-amz-security-token"] = token
        signed = sorted(
            k.lower() for k in headers if k.lower() == "host" or k.lower().startswith("x-amz-")
        )
        lower = {k.lower(): str(v).strip() for k, v in headers.items()}
        canonical = "\n".join(
            [
                method,
                parts.path or "/",
                query,
                "".join(f"{name}:{lower[name]}\n" for name in signed),
                ";".join(signed),
                "UNSIGNED-PAYLOAD",
            ]
        )
        scope = f"{now[:8]}/{region}/s3/aws4_request"
        text = "\n".join(
            ["AWS4-HMAC-SHA256", now, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        signing = f"AWS4{secret}".encode()
        for part in (now[:8], region, "s3", "aws4_request"):
            signing = hmac.new(signing, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(signing, text.encode(), hashlib.sha256).hexdigest()
        headers["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={key}/{scope}, SignedHeaders={';'.join(signed)}, "
            f"Signature={signature}"
        )
        del headers["host"]  # http.client sends it
        return headers

    def head(self, key: str) -> Entry | None:
        status, headers, _ = self._call("HEAD", key, {}, {}, ok=(200, 404))
        if status == 404:
            return None
        metadata = {
            k[len("x-amz-meta-") :]: v for k, v in headers.items() if k.startswith("x-amz-meta-")
        }
        modified = _http_date(headers["last-modified"]) if "last-modified" in headers else 0.0
        return Entry(key, int(headers.get("content-length", 0)), modified, metadata)

    def get(self, key: str, start: int, end: int) -> bytes:
        return self._call("GET", key, {}, {"Range": f"bytes={start}-{end - 1}"})[2]

    def put(self, key: str, path: str, metadata: dict[str, str], tags: dict[str, str]) -> None:
        headers = {f"x-amz-meta-{k}": v for k, v in metadata.items()}
        headers["Content-Length"] = str(os.path.getsize(path))
        if tags:
            headers["x-amz-tagging"] = urllib.parse.urlencode(tags)
        self._call("PUT", key, {}, headers, _Body([path]))

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call("PUT", key, {}, {"Content-Length": str(len(data))}, data)

    def delete(self, key: str) -> None:
        self._call("DELETE", key, {}, {}, ok=(200, 204, 404))

    def list(self, prefix: str) -> Iterator[Entry]:
        token: str | None = None
        ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            root = ElementTree.fromstring(self._call("GET", "", query, {})[2])
            for item in root.iter(f"{ns}Contents"):
                yield Entry(
                    item.findtext(f"{ns}Key") or "",
                    int(item.findtext(f"{ns}Size") or 0),
                    _iso8601(item.findtext(f"{ns}LastModified") or "1970-01-01T00:00:00Z"),
                    {},
                )
            token = root.findtext(f"{ns}NextContinuationToken")
            if root.findtext(f"{ns}IsTruncated") != "true" or not token:
                return


# ── Google Cloud Storage ───────────────────────────────────────────────────────────────


class GCS(Store):
    """GCS's JSON API with a bearer token: ``CLOUDSDK_AUTH_ACCESS_TOKEN``, else the
    instance's service account from the metadata server (``GCE_METADATA_HOST`` honoured);
    none at all only at an endpoint (an emulator)."""

    def __init__(self, bucket: str, endpoint: str | None, token: str | None = None) -> None:
        self.bucket = bucket
        self.base = endpoint or "https://storage.googleapis.com"
        self.endpoint = endpoint
        self._token, self._expires = token, float("inf")
        self._lock = threading.Lock()  # guards: _token, _expires

    def _auth(self) -> dict[str, str]:
        with self._lock:
            if self._token is None or time.time() > self._expires - 300:
                self._token = os.environ.get("CLOUDSDK_AUTH_ACCESS_TOKEN") or self._metadata()
            return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _metadata(self) -> str:
        host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
        url = f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token"
        try:
            _, _, blob = _request(
                "GET", url, {"Metadata-Flavor": "Google"}, timeout=_METADATA_TIMEOUT
            )
        except StoreError as error:
            if self.endpoint:
                return ""  # an emulator asks for none
            raise StoreError(
                f"no GCS credentials: no token in the environment ({error})"
            ) from error
        found = json.loads(blob)
        self._expires = time.time() + float(found.get("expires_in", 3600))
        return str(found["access_token"])

    def _object(self, key: str) -> str:
        return f"b/{self.bucket}/o/{urllib.parse.quote(key, safe='')}"

    def head(self, key: str) -> Entry | None:
        status, _, blob = _request(
            "GET", f"{self.base}/storage/v1/{self._object(key)}", self._auth(), ok=(200, 404)
        )
        return None if status == 404 else self._entry(json.loads(blob))

    @staticmethod
    def _entry(item: dict[str, Any]) -> Entry:
        metadata = {str(k): str(v) for k, v in (item.get("metadata") or {}).items()}
        updated = str(item.get("updated") or item.get("timeCreated") or "1970-01-01T00:00:00Z")
        return Entry(str(item["name"]), int(str(item.get("size", 0))), _iso8601(updated), metadata)

    def get(self, key: str, start: int, end: int) -> bytes:
        headers = {**self._auth(), "Range": f"bytes={start}-{end - 1}"}
        url = f"{self.base}/download/storage/v1/{self._object(key)}?alt=media"
        return _request("GET", url, headers)[2]

    def _upload(
        self, key: str, parts: builtins.list[object], size: int, metadata: dict[str, str]
    ) -> None:
        boundary = "skyward-" + hashlib.sha256(key.encode()).hexdigest()[:16]
        head = (
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
            + json.dumps({"name": key, "metadata": metadata})
            + f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
        ).encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        headers = {
            **self._auth(),
            "Content-Type": f"multipart/related; boundary={boundary}",
            "Content-Length": str(len(head) + size + len(tail)),
        }
        url = f"{self.base}/upload/storage/v1/b/{self.bucket}/o?uploadType=multipart"
        _request("POST", url, headers, _Body([head, *parts, tail]))

    def put(self, key: str, path: str, metadata: dict[str, str], tags: dict[str, str]) -> None:
        # GCS objects have no tags: the pool's tags are metadata like the rest.
        self._upload(key, [path], os.path.getsize(path), {**tags, **metadata})

    def put_bytes(self, key: str, data: bytes) -> None:
        self._upload(key, [data], len(data), {})

    def delete(self, key: str) -> None:
        _request(
            "DELETE",
            f"{self.base}/storage/v1/{self._object(key)}",
            self._auth(),
            ok=(200, 204, 404),
        )

    def list(self, prefix: str) -> Iterator[Entry]:
        token = ""
        while True:
            query = urllib.parse.urlencode(
                {"prefix": prefix, **({"pageToken": token} if token else {})}
            )
            url = f"{self.base}/storage/v1/b/{self.bucket}/o?{query}"
            found = json.loads(_request("GET", url, self._auth())[2])
            for item in found.get("items", []):
                yield self._entry(item)
            token = found.get("nextPageToken") or ""
            if not token:
                return


# ── Azure Blob Storage ─────────────────────────────────────────────────────────────────


class Azure(Store):
    """Blob storage: Shared Key from ``AZURE_STORAGE_KEY``, a SAS from
    ``AZURE_STORAGE_SAS_TOKEN``, else a managed identity's bearer token from IMDS. At an
    endpoint the account is the URL's first path segment (Azurite's path style)."""

    VERSION = "2021-08-06"

    def __init__(
        self,
        account: str,
        container: str,
        endpoint: str | None,
        shared_key: str | None = None,
        token: str | None = None,
    ) -> None:
        self.account, self.container, self.endpoint = account, container, endpoint
        self.shared_key = shared_key
        self.base = (
            f"{endpoint}/{account}" if endpoint else f"https://{account}.blob.core.windows.net"
        )
        self._token: str | None = token
        self._expires = float("inf")
        self._lock = threading.Lock()  # guards: _token, _expires

    def _path(self, key: str) -> str:
        return f"/{self.container}" + (f"/{urllib.parse.quote(key, safe='/~-_.')}" if key else "")

    def _call(
        self,
        method: str,
        key: str,
        query: dict[str, str],
        headers: dict[str, str],
        body: bytes | _Body | None = None,
        ok: tuple[int, ...] = (200, 201, 202, 204, 206),
    ) -> tuple[int, dict[str, str], bytes]:
        headers = {
            **headers,
            "x-ms-version": self.VERSION,
            "x-ms-date": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()),
        }
        if body is not None:
            headers["Content-Type"] = "application/octet-stream"  # signed, so set here
        path = self._path(key)
        encoded = urllib.parse.urlencode(sorted(query.items()))
        sas = os.environ.get("AZURE_STORAGE_SAS_TOKEN", "").lstrip("?")
        shared = self.shared_key or os.environ.get("AZURE_STORAGE_KEY")
        if shared:
            headers["Authorization"] = self._shared_key(method, path, query, headers, shared)
        elif sas:
            encoded = "&".join(x for x in (encoded, sas) if x)
        else:
            headers["Authorization"] = f"Bearer {self._managed_identity()}"
        url = f"{self.base}{path}" + (f"?{encoded}" if encoded else "")
        return _request(method, url, headers, body, ok)

    def _shared_key(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], key: str
    ) -> str:
        lower = {k.lower(): v for k, v in headers.items()}
        length = lower.get("content-length", "")
        standard = [
            method,
            lower.get("content-encoding", ""),
            lower.get("content-language", ""),
            "" if length == "0" else length,
            lower.get("content-md5", ""),
            lower.get("content-type", ""),
            "",  # Date: x-ms-date is sent instead
            lower.get("if-modified-since", ""),
            lower.get("if-match", ""),
            lower.get("if-none-match", ""),
            lower.get("if-unmodified-since", ""),
            lower.get("range", ""),
        ]
        canonical_headers = "".join(
            f"{k}:{lower[k].strip()}\n" for k in sorted(lower) if k.startswith("x-ms-")
        )
        # The resource is the account and the URI's path; at an emulator the path holds the
        # account too, so it appears twice.
        resource = f"/{self.account}" + (f"/{self.account}" if self.endpoint else "") + path
        resource += "".join(f"\n{k.lower()}:{v}" for k, v in sorted(query.items()))
        text = "\n".join(standard) + "\n" + canonical_headers + resource
        signature = hmac.new(base64.b64decode(key), text.encode(), hashlib.sha256).digest()
        return f"SharedKey {self.account}:{base64.b64encode(signature).decode()}"

    def _managed_identity(self) -> str:
        with self._lock:
            if self._token is None or time.time() > self._expires - 300:
                url = (
                    "http://169.254.169.254/metadata/identity/oauth2/token?api-version=2018-02-01"
                    "&resource=https%3A%2F%2Fstorage.azure.com%2F"
                )
                try:
                    _, _, blob = _request(
                        "GET", url, {"Metadata": "true"}, timeout=_METADATA_TIMEOUT
                    )
                except StoreError as error:
                    raise StoreError(
                        "no Azure credentials: none in the environment, no managed "
                        f"identity ({error})"
                    ) from error
                found = json.loads(blob)
                self._token = str(found["access_token"])
                self._expires = float(found.get("expires_on", time.time() + 3600))
            return self._token

    def head(self, key: str) -> Entry | None:
        status, headers, _ = self._call("HEAD", key, {}, {}, ok=(200, 404))
        if status == 404:
            return None
        metadata = {
            k[len("x-ms-meta-") :]: v for k, v in headers.items() if k.startswith("x-ms-meta-")
        }
        modified = _http_date(headers["last-modified"]) if "last-modified" in headers else 0.0
        return Entry(key, int(headers.get("content-length", 0)), modified, metadata)

    def get(self, key: str, start: int, end: int) -> bytes:
        return self._call("GET", key, {}, {"x-ms-range": f"bytes={start}-{end - 1}"})[2]

    def put(self, key: str, path: str, metadata: dict[str, str], tags: dict[str, str]) -> None:
        # Metadata names are identifiers (skyward_pool); index tags take fewer characters in
        # their values than the tags carry (an owner's '@'), so those become '_' there.
        named = {k.replace("-", "_"): v for k, v in {**tags, **metadata}.items()}
        headers = {f"x-ms-meta-{k}": v for k, v in named.items()}
        headers.update(
            {"x-ms-blob-type": "BlockBlob", "Content-Length": str(os.path.getsize(path))}
        )
        if tags:
            allowed = {k: re.sub(r"[^A-Za-z0-9 +\-.:=_/]", "_", v) for k, v in tags.items()}
            headers["x-ms-tags"] = urllib.parse.urlencode(allowed)
        self._call("PUT", key, {}, headers, _Body([path]))

    def put_bytes(self, key: str, data: bytes) -> None:
        headers = {"x-ms-blob-type": "BlockBlob", "Content-Length": str(len(data))}
        self._call("PUT", key, {}, headers, data)

    def delete(self, key: str) -> None:
        self._call("DELETE", key, {}, {}, ok=(200, 202, 404))

    def list(self, prefix: str) -> Iterator[Entry]:
        marker = ""
        while True:
            query = {
                "restype": "container",
                "comp": "list",
                "prefix": prefix,
                "include": "metadata",
            }
            if marker:
                query["marker"] = marker
            root = ElementTree.fromstring(self._call("GET", "", query, {})[2])
            for blob in root.iter("Blob"):
                props = blob.find("Properties")
                meta = blob.find("Metadata")
                yield Entry(
                    blob.findtext("Name") or "",
                    int((props.findtext("Content-Length") if props is not None else None) or 0),
                    _http_date(props.findtext("Last-Modified") or "") if props is not None else 0.0,
                    {m.tag.lower(): m.text or "" for m in meta} if meta is not None else {},
                )
            marker = root.findtext("NextMarker") or ""
            if not marker:
                return


def open_store(url: str, endpoint: str | None = None) -> tuple[Store, str]:
    """The store ``url`` names, and the key prefix in it (no trailing '/')."""
    scheme, bucket, container, prefix = parse(url)
    if scheme == "s3":
        return S3(bucket, endpoint), prefix
    if scheme == "gs":
        return GCS(bucket, endpoint), prefix
    return Azure(bucket, container, endpoint), prefix


# ── on a node: the bootstrap's three commands ──────────────────────────────────────────


def say(text: str) -> None:
    print(f"skyward: cache: {text}", flush=True)


def entry_key(prefix: str, digest: str, python: str, version: str) -> str:
    """``<prefix>/<digest>/<platform>-<python>.tar.zst``. The platform is the machine and
    its C library (a wheel built for a newer glibc does not load on an older one); the
    Python is the host's own interpreter by path and exact version, or ``managed``."""
    libc, libc_version = platform.libc_ver()
    where = f"{platform.machine()}-{libc or 'musl'}{libc_version}"
    if python:
        if os.path.realpath(python) == os.path.realpath(sys.executable):
            # The bootstrap runs this file with that interpreter: ask this process rather
            # than start another (tens to hundreds of ms before the download starts).
            found = f"{os.path.realpath(sys.executable)} {sys.version}\n"
        else:
            probe = "import os, sys; print(os.path.realpath(sys.executable), sys.version)"
            found = subprocess.run([python, "-c", probe], capture_output=True, text=True).stdout
        tag = "host-" + hashlib.sha256(found.encode()).hexdigest()[:12]
    else:
        tag = f"managed{version}"
    return "/".join(p for p in (prefix, digest, f"{where}-{tag}.tar.zst") if p)


def _ranges(size: int) -> Iterator[tuple[int, int]]:
    """``[start, end)`` ranges covering ``size`` bytes: FIRST_CHUNK, doubling up to CHUNK."""
    start, length = 0, FIRST_CHUNK
    while start < size:
        end = min(start + length, size)
        yield start, end
        start, length = end, min(length * 2, CHUNK)


def _download(store: Store, entry: Entry, sink: Callable[[bytes], None]) -> None:
    """Every byte of ``entry`` into ``sink``, in order, from parallel ranged GETs (a bounded
    window of them, so memory stays at ``WORKERS x 2 x CHUNK``)."""
    ranges = _ranges(entry.size)
    window: collections.deque[tuple[int, int, Future[bytes]]] = collections.deque()
    with ThreadPoolExecutor(WORKERS) as pool:

        def more() -> None:
            while len(window) < WORKERS * 2:
                found = next(ranges, None)
                if found is None:
                    return
                start, end = found
                window.append((start, end, pool.submit(store.get, entry.key, start, end)))

        more()
        while window:
            start, end, future = window.popleft()
            data = future.result()
            if len(data) != end - start:
                raise StoreError(f"bytes {start}-{end} came back as {len(data)} bytes")
            sink(data)
            more()


def fetch(store: Store, key: str, home: str, env_dir: str) -> int:
    """Unpack the entry into ``home`` if it is there and whole; HIT or MISS."""
    try:
        entry = store.head(key)
    except StoreError as error:
        say(f"cannot read {key} ({error}); building")
        return MISS
    if entry is None:
        say(f"no entry {key} yet")
        return MISS
    recorded = entry.metadata.get(SHA256, "")
    scratch = f"{home}/.cache-unpack.{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    started = time.monotonic()
    digest = hashlib.sha256()
    # zstd -d | tar -x: the download streams into the unpacker as it arrives.
    unzstd = subprocess.Popen(
        ["zstd", "-d", "-q", "-c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    untar = subprocess.Popen(["tar", "-x", "-C", scratch], stdin=unzstd.stdout)
    assert unzstd.stdin is not None and unzstd.stdout is not None
    stdin = unzstd.stdin
    unzstd.stdout.close()
    failure = ""

    def sink(data: bytes) -> None:
        digest.update(data)
        stdin.write(data)

    try:
        _download(store, entry, sink)
    except (StoreError, OSError) as error:
        failure = f"the download failed ({error})"
    finally:
        try:
            stdin.close()
        except OSError:
            pass
        unpacked = unzstd.wait() == 0 and untar.wait() == 0
        untar.wait()
    if not failure and digest.hexdigest() != recorded:
        failure = (
            f"its SHA-256 is {digest.hexdigest()[:16]}..., not the recorded "
            f"{recorded[:16] or 'none'}... (a partial or damaged object)"
        )
    if not failure and not unpacked:
        failure = "zstd or tar could not unpack it"
    if failure:
        shutil.rmtree(scratch, ignore_errors=True)
        say(f"ignoring {key}: {failure}; building")
        return MISS
    _move_into_place(scratch, home, env_dir, entry.metadata.get(HOME, home))
    seconds = time.monotonic() - started
    say(f"unpacked {key} ({entry.size / 1e6:.1f} MB in {seconds:.1f} s)")
    return HIT


def _move_into_place(scratch: str, home: str, env_dir: str, built_home: str) -> None:
    """The unpacked trees into ``home``, then pointed at ``home`` if they were built under
    another directory (another workdir, another user's home on the builder)."""
    pythons = os.path.join(scratch, "pythons")
    if os.path.isdir(pythons):
        os.makedirs(os.path.join(home, "pythons"), exist_ok=True)
        for name in os.listdir(pythons):
            target = os.path.join(home, "pythons", name)
            if not os.path.lexists(target):  # a CPython a bootstrap already put here stays
                os.rename(os.path.join(pythons, name), target)
                if built_home != home:
                    _repoint(target, built_home, home)  # uv's minor-version link
    shutil.rmtree(env_dir, ignore_errors=True)
    os.rename(os.path.join(scratch, "envs", os.path.basename(env_dir)), env_dir)
    shutil.rmtree(scratch, ignore_errors=True)
    if built_home != home:
        _relocate(env_dir, built_home, home)


def _repoint(path: str, old: str, new: str) -> None:
    """A link into ``old`` made to point at the same place under ``new``."""
    if os.path.islink(path) and os.readlink(path).startswith(old + "/"):
        target = new + os.readlink(path)[len(old) :]
        os.remove(path)
        os.symlink(target, path)


def _relocate(env_dir: str, old: str, new: str) -> None:
    config = os.path.join(env_dir, "pyvenv.cfg")
    with open(config) as file:
        text = file.read()
    with open(config, "w") as file:
        file.write(text.replace(old + "/", new + "/"))
    bin_dir = os.path.join(env_dir, "bin")
    for name in os.listdir(bin_dir):
        _repoint(os.path.join(bin_dir, name), old, new)


def probe(store: Store, key: str) -> int:
    """Can this node write the cache? A small marker says so (and that it builds)."""
    try:
        store.put_bytes(f"{key}.building", f"{platform.node()} {time.time():.0f}\n".encode())
    except StoreError as error:
        say(f"cannot write {key} ({error})")
        return UNWRITABLE
    return HIT


def publish(store: Store, key: str, home: str, env_dir: str, tags: dict[str, str]) -> int:
    """Pack the environment (and its uv-managed CPython) and upload it; never fails the
    bootstrap: an entry not written is one the next pool builds again."""
    members = [os.path.relpath(env_dir, home)]
    members += _managed_python(home, env_dir)
    packed = f"{home}/.cache-pack.{os.getpid()}.tar.zst"
    started = time.monotonic()
    try:
        tar = subprocess.Popen(["tar", "-C", home, "-cf", "-", *members], stdout=subprocess.PIPE)
        with open(packed, "wb") as out:
            zstd = subprocess.run(["zstd", "-q", "-T0", "-3", "-c"], stdin=tar.stdout, stdout=out)
        if tar.wait() != 0 or zstd.returncode != 0:
            say("tar or zstd failed; not uploading")
            return UNWRITABLE
        digest = hashlib.sha256()
        with open(packed, "rb") as file:
            for block in iter(lambda: file.read(CHUNK), b""):
                digest.update(block)
        metadata = {SHA256: digest.hexdigest(), HOME: home, CREATED: f"{time.time():.0f}"}
        size = os.path.getsize(packed)
        store.put(key, packed, metadata, tags)
        say(f"uploaded {key} ({size / 1e6:.1f} MB in {time.monotonic() - started:.1f} s)")
        return HIT
    except (StoreError, OSError) as error:
        say(f"could not upload {key} ({error})")
        return UNWRITABLE
    finally:
        if os.path.exists(packed):
            os.remove(packed)
        try:
            store.delete(f"{key}.building")
        except StoreError:
            pass


def _managed_python(home: str, env_dir: str) -> list[str]:
    """The uv-managed CPython under ``home/pythons`` the environment was made from (and the
    links uv keeps to it), relative to ``home``; none for a host's own Python."""
    config = os.path.join(env_dir, "pyvenv.cfg")
    with open(config) as file:
        found = re.search(r"^home\s*=\s*(.+)$", file.read(), re.M)
    pythons = os.path.realpath(os.path.join(home, "pythons"))
    if not found or not os.path.isdir(pythons):
        return []
    used = os.path.realpath(found.group(1).strip())
    if not used.startswith(pythons + os.sep):
        return []
    top = used[len(pythons) + 1 :].split(os.sep)[0]
    real = os.path.join(pythons, top)
    return [
        f"pythons/{name}"
        for name in sorted(os.listdir(pythons))
        if not name.startswith(".") and os.path.realpath(os.path.join(pythons, name)) == real
    ]


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="skyward-cache")
    parser.add_argument("command", choices=("fetch", "probe", "publish"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--endpoint", default="")
    parser.add_argument("--digest", required=True)
    parser.add_argument("--python", default="")  # the host's interpreter; "" = uv-managed
    parser.add_argument("--version", required=True)
    parser.add_argument("--home", default="")
    parser.add_argument("--env-dir", default="")
    parser.add_argument("--tags", default="")  # the pool's tags, as a query string
    options = parser.parse_args(argv)
    if shutil.which("zstd") is None or shutil.which("tar") is None:
        say("this host has no zstd (or tar): add it to the image (apt=['zstd']); building")
        return NO_TOOLS
    store, prefix = open_store(options.url, options.endpoint or None)
    key = entry_key(prefix, options.digest, options.python, options.version)
    if options.command == "fetch":
        return fetch(store, key, options.home, options.env_dir)
    if options.command == "probe":
        return probe(store, key)
    tags = dict(urllib.parse.parse_qsl(options.tags))
    return publish(store, key, options.home, options.env_dir, tags)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
