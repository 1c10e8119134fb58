"""Cold and cached starts of SSH pools with a multi-hundred-MB environment, by phase: what the
environment cache (``Image(cache=...)``, issue 37) saves.

::

    .venv/bin/python benchmarks/envcache_start.py               # 2 and 4 nodes, 1 round
    .venv/bin/python benchmarks/envcache_start.py --nodes 2 --rounds 3

Per node count and round, on the test suite's fixtures (root and ``openssh-server``
needed): new hosts (empty homes: no uv, no uv cache, no environment), a package index on
their bridge serving the wheels cached under ``~/.cache/skyward-tests/wheels`` (jax, jaxlib,
scipy, scikit-learn, sympy, networkx: about 700 MB installed, a 150 MB entry), and a store on
the bridge (``--store``: the GCS emulator by default, moto's S3 or Azurite) with its test
credentials in the hosts' own environment. Three starts:

    uncached   no cache: uv, the venv, ``uv pip install`` from the index
    cold       a cache with no entry yet: one node builds and uploads, the others wait
               and download (new hosts again, so uv's own cache is cold too)
    cached     the cold run's hosts in a new workdir: every node downloads and unpacks

It prints each start's seconds by stage (``pool.timings()``: the slowest node's) and the
cached bootstrap as a fraction of the uncached one (issue 37's target: at most 25 %), and
writes them to ``benchmarks/results/envcache-<store>-<UTC time>.json``. Nothing leaves the
test bridge; everything is stopped by PID and removed.

The stores are test servers, and their costs are theirs: moto answers each ranged GET by
reading the whole object and slicing it (a 146 MB entry in 16 MB ranges takes it 4.5 s,
where the GCS emulator serves it in about 1 s), and the GCS emulator takes about 20 s to
accept an upload of that size (it parses the multipart body and checksums it in Python).
So the cached rows are closest to a real store's with the GCS emulator, and the cold rows'
``publish`` is longest there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
# moto's test credentials for this process's boto3 (making the bucket, sizing the entry);
# the hosts get theirs in their own environment.
os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
os.environ.update(AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")

from support.objectstores import AzuriteServer, GCSServer, S3Server
from support.sshhosts import Hosts, PackageIndex

import skyward as sky

_WHEELS = Path.home() / ".cache" / "skyward-tests" / "wheels"
ENVIRONMENT = ["jax", "jaxlib", "scipy", "scikit-learn", "sympy", "networkx"]
_STORES = {"gcs": GCSServer, "s3": S3Server, "azure": AzuriteServer}
_STAGES = ("boot", "bootstrap", "cache", "uv", "python", "packages", "publish", "skyward")


def _check_wheels() -> None:
    names = {p.name.split("-")[0].lower().replace("_", "-") for p in _WHEELS.glob("*.whl")}
    missing = [n for n in [*ENVIRONMENT, "uv", "cloudpickle", "pydantic"] if n not in names]
    if missing:
        sys.exit(
            f"{_WHEELS} lacks wheels for {missing}: run the SSH tests once (they fill it), or "
            f"pip download them there"
        )


def _imports() -> int:
    import jax
    import scipy
    import sklearn
    import sympy

    return len({jax.__name__, scipy.__name__, sklearn.__name__, sympy.__name__})


def _start(hosts: Hosts, nodes: int, image: sky.Image) -> dict[str, Any]:
    """One pool from ``ComputePool(...)`` to ready in a fresh workdir; its timings."""
    provider = sky.SSH(
        hosts=[h.target for h in hosts.hosts[:nodes]],
        key=hosts.client_key,
        known_hosts=hosts.known_hosts,
        workdir=f"~/.cache/skyward-{uuid.uuid4().hex[:8]}",
    )
    started = time.perf_counter()
    with sky.ComputePool(provider=provider, nodes=nodes, image=image, quiet=True) as pool:
        ready = time.perf_counter() - started
        timings = pool.timings()
        assert pool.broadcast(_imports) == [4] * nodes  # the environment works
    row = {stage: round(timings[stage], 3) for stage in _STAGES}
    row.update(ready=round(ready, 3), bootstrap_total=round(timings.bootstrap, 3))
    return row


class _Bed:
    """New hosts, their index and a store on their bridge."""

    def __init__(self, nodes: int, store: str) -> None:
        self.hosts = Hosts.start(nodes)
        self.index: PackageIndex | None = None
        self.s3: S3Server | GCSServer | AzuriteServer | None = None
        try:
            self.index = PackageIndex(self.hosts.root / "index", self.hosts.bridge_address)
            self.index.add(sorted(_WHEELS.glob("*.whl")))
            self.s3 = _STORES[store](self.hosts.bridge_address)
            self.hosts.set_environment(self.s3.env)
        except BaseException:
            self.close()
            raise

    def image(self, prefix: str | None) -> sky.Image:
        assert self.index is not None and self.s3 is not None
        cache = {} if prefix is None else {"cache": self.s3.cache_url(prefix)}
        return sky.Image(
            pip=ENVIRONMENT, index_url=self.index.url, cache_endpoint=self.s3.url, **cache
        )

    def entry_size(self, prefix: str) -> int:
        assert self.s3 is not None
        (key,) = self.s3.keys(prefix)
        return len(self.s3.read(key)[0])

    def close(self) -> None:
        if self.s3 is not None:
            self.s3.close()
        if self.index is not None:
            self.index.close()
        self.hosts.close()


def _round(nodes: int, store: str) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    bed = _Bed(nodes, store)
    try:
        rows["uncached"] = _start(bed.hosts, nodes, bed.image(None))
    finally:
        bed.close()
    bed = _Bed(nodes, store)
    try:
        prefix = uuid.uuid4().hex[:8]
        rows["cold"] = _start(bed.hosts, nodes, bed.image(prefix))
        rows["cached"] = _start(bed.hosts, nodes, bed.image(prefix))
        rows["cached"]["entry_mb"] = round(bed.entry_size(prefix) / 1e6, 1)
    finally:
        bed.close()
    return rows


def _table(results: dict[int, list[dict[str, dict[str, Any]]]]) -> str:
    head = ["nodes", "start", "ready s", "bootstrap s", *_STAGES, "cached/uncached"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for nodes, rounds in results.items():

        def median(kind: str, key: str, rounds: list[dict[str, dict[str, Any]]] = rounds) -> float:
            return statistics.median(r[kind][key] for r in rounds)

        for kind in ("uncached", "cold", "cached"):
            fraction = ""
            if kind == "cached":
                share = median("cached", "bootstrap_total") / median("uncached", "bootstrap_total")
                fraction = f"{share:.0%}"
            cells = [
                str(nodes),
                kind,
                f"{median(kind, 'ready'):.2f}",
                f"{median(kind, 'bootstrap_total'):.2f}",
                *(f"{median(kind, s):.2f}" for s in _STAGES),
                fraction,
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--tmpfs",
        action="store_true",
        help="put the hosts' homes on a tmpfs: each as fast as a VM's own disk, where this "
        "machine's one disk is shared by everything running on it",
    )
    parser.add_argument(
        "--store",
        choices=sorted(_STORES),
        default="gcs",
        help="which local store keeps the cache (see the docstring on moto's ranged GETs)",
    )
    options = parser.parse_args()
    _check_wheels()
    results: dict[int, list[dict[str, dict[str, Any]]]] = {n: [] for n in options.nodes}
    scratch = None
    if options.tmpfs:
        # Hosts.start makes its directories with tempfile: on the tmpfs from here on.
        scratch = tempfile.mkdtemp(prefix="skyward-envcache-bench-")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24g", "tmpfs", scratch], check=True)
        tempfile.tempdir = scratch
    try:
        for round_number in range(options.rounds):
            for nodes in options.nodes:
                print(f"round {round_number + 1}: {nodes} nodes", file=sys.stderr, flush=True)
                results[nodes].append(_round(nodes, options.store))
                print(json.dumps(results[nodes][-1]), file=sys.stderr, flush=True)
    finally:
        if scratch is not None:
            tempfile.tempdir = None
            # The hosts' last processes may still be leaving: then the mount goes when they have.
            for _ in range(50):
                if subprocess.run(["umount", scratch], capture_output=True).returncode == 0:
                    break
                time.sleep(0.2)
            else:
                subprocess.run(["umount", "--lazy", scratch], check=False)
            os.rmdir(scratch)
    table = _table(results)
    print(table)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (out / f"envcache-{options.store}-{stamp}.json").write_text(json.dumps(results, indent=1))
    (out / f"envcache-{options.store}-{stamp}.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
