"""Real local object stores for the environment cache's tests, and a package index that
counts what it is asked.

::

    root namespace (the bridge's address)            hosts (namespaces on the bridge)
    ──────────────────────────────────────           ──────────────────────────────────
    moto's server          S3          :port   <──── the bootstrap's store client,
    gcp-storage-emulator   GCS         :port   <──── pointed there by Image(cache_endpoint=)
    Azurite                Azure Blob  :port   <──── and given test credentials by the
    CountingIndex          PEP 503     :port   <──── host's own environment (never the
                                                     script): ``env`` of each store

Each is started on the bridge, waited for, and stopped by PID. The credentials a store's
``env`` gives are its emulator's well-known test ones; the tests put them in the hosts'
``~/.ssh/environment``, as a user sets a machine's own settings, so the client never sends
them (on a cloud, the machine's identity takes their place).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from support.clouds.aws.fake import MotoServer


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _wait_http(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class S3Server:
    """moto's server as S3 on ``host``; ``bucket`` made."""

    scheme = "s3"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }

    def __init__(self, host: str, bucket: str = "skyward-envcache") -> None:
        self.moto = MotoServer(host=host, placement_groups=False)
        self.url = self.moto.url
        self.bucket = bucket
        self.client().create_bucket(Bucket=bucket)

    def client(self) -> Any:
        return self.moto.client("s3")

    def cache_url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def keys(self, prefix: str) -> list[str]:
        found = self.client().list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for item in found.get("Contents", []))

    def read(self, key: str) -> tuple[bytes, dict[str, str]]:
        answer = self.client().get_object(Bucket=self.bucket, Key=key)
        return answer["Body"].read(), dict(answer["Metadata"])

    def write(self, key: str, data: bytes, metadata: dict[str, str]) -> None:
        self.client().put_object(Bucket=self.bucket, Key=key, Body=data, Metadata=metadata)

    def tags(self, key: str) -> dict[str, str]:
        found = self.client().get_object_tagging(Bucket=self.bucket, Key=key)["TagSet"]
        return {tag["Key"]: tag["Value"] for tag in found}

    def close(self) -> None:
        self.moto.close()


class GCSServer:
    """gcp-storage-emulator on ``host``, in memory, with ``bucket``."""

    scheme = "gs"
    env: dict[str, str] = {}  # the emulator takes any request; no token is needed

    def __init__(self, host: str, bucket: str = "skyward-envcache") -> None:
        self.bucket = bucket
        port = free_port(host)
        self.url = f"http://{host}:{port}"
        self.log = Path(tempfile.mkstemp(prefix="gcs-emulator-", suffix=".log")[1])
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gcp_storage_emulator",
                    "start",
                    "--host",
                    host,
                    "--port",
                    str(port),
                    "--in-memory",
                    "--default-bucket",
                    bucket,
                    "-q",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            _wait_http(f"{self.url}/", self.process, self.log)
        except BaseException:
            self.close()
            raise

    def cache_url(self, prefix: str) -> str:
        return f"gs://{self.bucket}/{prefix}"

    def _store(self) -> Any:
        from skyward.providers.envcache.store import GCS

        return GCS(self.bucket, self.url, token="")

    def keys(self, prefix: str) -> list[str]:
        return sorted(entry.key for entry in self._store().list(prefix))

    def read(self, key: str) -> tuple[bytes, dict[str, str]]:
        store = self._store()
        entry = store.head(key)
        return store.get(key, 0, entry.size) if entry.size else b"", dict(entry.metadata)

    def write(self, key: str, data: bytes, metadata: dict[str, str]) -> None:
        store = self._store()
        with tempfile.NamedTemporaryFile() as file:
            file.write(data)
            file.flush()
            store.put(key, file.name, metadata, {})

    def tags(self, key: str) -> dict[str, str]:
        return dict(self._store().head(key).metadata)

    def close(self) -> None:
        _stop(self.process)
        self.log.unlink(missing_ok=True)


class AzuriteServer:
    """Azurite's blob service on ``host``, its data in a temporary directory, with its
    well-known test account (``devstoreaccount1``) and ``container`` made; no telemetry (it
    would call out)."""

    scheme = "az"
    account = "devstoreaccount1"
    key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    env = {"AZURE_STORAGE_KEY": key}

    def __init__(self, host: str, container: str = "skyward-envcache") -> None:
        self.bucket = container
        port = free_port(host)
        self.url = f"http://{host}:{port}"
        self.log = Path(tempfile.mkstemp(prefix="azurite-", suffix=".log")[1])
        self.data = Path(tempfile.mkdtemp(prefix="azurite-"))
        command = [
            *azurite_command(),
            "--blobHost",
            host,
            "--blobPort",
            str(port),
            "--location",
            str(self.data),
            "--disableTelemetry",
            "--skipApiVersionCheck",
            "--silent",
        ]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            _wait_http(f"{self.url}/{self.account}?comp=list", self.process, self.log)
            self._store()._call("PUT", "", {"restype": "container"}, {})
        except BaseException:
            self.close()
            raise

    def cache_url(self, prefix: str) -> str:
        return f"az://{self.account}/{self.bucket}/{prefix}"

    def _store(self) -> Any:
        from skyward.providers.envcache.store import Azure

        return Azure(self.account, self.bucket, self.url, shared_key=self.key)

    keys = GCSServer.keys
    read = GCSServer.read
    write = GCSServer.write

    def tags(self, key: str) -> dict[str, str]:
        """The blob's index tags (Get Blob Tags)."""
        import xml.etree.ElementTree as ElementTree

        body = self._store()._call("GET", key, {"comp": "tags"}, {})[2]
        root = ElementTree.fromstring(body)
        return {t.findtext("Key") or "": t.findtext("Value") or "" for t in root.iter("Tag")}

    def close(self) -> None:
        _stop(self.process)
        self.log.unlink(missing_ok=True)
        shutil.rmtree(self.data, ignore_errors=True)


class CountingIndex:
    """The package index's files (``root``, a PEP 503 tree) served again on ``host``, with
    every request counted: what a bootstrap asked the index for."""

    def __init__(self, root: Path, host: str) -> None:
        self.requests: list[str] = []
        self._lock = threading.Lock()  # guards: requests
        counting = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                with counting._lock:
                    counting.requests.append(self.path)

        handler = functools.partial(Handler, directory=str(root))
        self._server = http.server.ThreadingHTTPServer((host, 0), handler)
        self.url = f"http://{host}:{self._server.server_address[1]}/simple/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def azurite_command() -> list[str]:
    """How to start Azurite's blob service: installed with npm into a cache directory the
    first time (as the Slurm fixture installs Slurm), then run from there."""
    home = Path(os.environ.get("SKYWARD_TEST_CACHE", Path.home() / ".cache" / "skyward-tests"))
    prefix = home / "azurite"
    script = prefix / "node_modules" / ".bin" / "azurite-blob"
    if not script.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("Azurite needs npm (apt-get install npm), and this machine has none")
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), "azurite@3"],
            check=True,
            timeout=600,
            capture_output=True,
        )
    return [str(script)]
