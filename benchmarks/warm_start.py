"""Cold and warm starts of a GCP pool, side by side in one run: from ``ComputePool(...)`` to
ready on new machines, and on the machines the previous pool kept (``keep_warm``), against
the Compute Engine fake and stand-in VMs (the test suite's fixtures: root and
``openssh-server`` needed).

::

    .venv/bin/python benchmarks/warm_start.py               # 2 and 4 nodes, 3 rounds each
    .venv/bin/python benchmarks/warm_start.py --nodes 4 --rounds 1 --pip numpy

Per round: a cold pool on fresh stand-ins (every machine boots and bootstraps from nothing,
as a new VM does), closed with ``keep_warm``; then a warm pool of the same spec, which adopts
those machines, closed for good. Cold and warm alternate, so whatever else runs on the
machine falls on both. Each warm start's steps come from ``pool.timings()``:

    warm.claim     the record found and locked, the cloud's API client made
    warm.describe  each kept machine described by the cloud (still running?)
    warm.reach     SSH with the pinned host key, the bootstrap (nothing to install), the
                   GPU count
    warm.unkeep    the watchdog's keep lifted
    workers        workers spawned until every one is ready

``--pip`` adds requirements to the image (downloaded once into the local index), for a
bigger environment: the cold start installs them, the warm one finds them installed.
Nothing leaves loopback and the test bridge; everything is stopped by PID and removed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
os.environ.setdefault("SKYWARD_STATE_DIR", tempfile.mkdtemp(prefix="skyward-bench-state-"))

from support.clouds.gcp.fake import GCPFake
from support.clouds.gcp.standins import GCPStandIns, MetadataServer, held, nothing
from support.clouds.gcp.standins import standin_provider as gcp
from support.sshhosts import Hosts, PackageIndex

import skyward as sky

_WHEELS = Path.home() / ".cache" / "skyward-tests" / "wheels"
_STEPS = ("warm.claim", "warm.describe", "warm.reach", "warm.unkeep", "workers")


def _pool(
    cloud: GCPStandIns, index: PackageIndex, name: str, nodes: int, pip: list[str], **options: float
) -> sky.ComputePool:
    return sky.ComputePool(
        provider=gcp(cloud, boot_timeout=60),
        nodes=nodes,
        image=sky.Image(index_url=index.url, pip=pip),
        name=name,
        quiet=True,
        **options,
    )


def one_round(
    cloud: GCPStandIns, index: PackageIndex, nodes: int, pip: list[str], round: int
) -> dict[str, float]:
    cold_name = f"cold-{nodes}-{round}"
    started = time.monotonic()
    with _pool(cloud, index, cold_name, nodes, pip, keep_warm=300) as cold:
        cold_ready = time.monotonic() - started
        before = cold.broadcast(os.getpid)
    started = time.monotonic()
    with _pool(cloud, index, f"warm-{nodes}-{round}", nodes, pip) as warm:
        warm_ready = time.monotonic() - started
        assert len(warm.broadcast(os.getpid)) == len(before)
        steps = warm.timings()
    assert "warm.reach" in steps, f"the warm pool did not adopt: {steps}"
    assert nothing(held(cloud.fake, cold_name))
    return {"cold": cold_ready, "warm": warm_ready, **{k: steps.get(k, 0.0) for k in _STEPS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pip", nargs="*", default=[], help="more requirements for the image")
    args = parser.parse_args()
    hosts = Hosts.start(0)  # the bridge only; stand-ins join it
    index = PackageIndex(hosts.root / "index", hosts.bridge_address)
    fake = GCPFake(host=hosts.bridge_address)
    fake.start()
    os.environ.update(fake.environ())
    metadata_server = MetadataServer(fake, hosts.bridge_address)
    try:
        pins = [f"{n}=={metadata.version(n)}" for n in ("cloudpickle", "pydantic")]
        index.download([*pins, "uv", *args.pip], _WHEELS)
        rows = []
        for nodes in args.nodes:
            samples = []
            for round in range(args.rounds):
                fake.reset()
                with GCPStandIns.start(fake, hosts, metadata=metadata_server) as cloud:
                    samples.append(one_round(cloud, index, nodes, args.pip, round))
            rows.append((nodes, samples))
        print(f"\nmedian seconds from ComputePool(...) to ready (rounds: {args.rounds})")
        print("nodes  cold    warm   | warm: claim  describe  reach  unkeep  workers")
        for nodes, samples in rows:
            med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
            print(
                f"{nodes:<6} {med['cold']:<7.2f} {med['warm']:<6.2f} |       "
                f"{med['warm.claim']:<6.2f} {med['warm.describe']:<9.2f} "
                f"{med['warm.reach']:<6.2f} {med['warm.unkeep']:<7.2f} {med['workers']:.2f}"
            )
    finally:
        metadata_server.close()
        fake.close()
        index.close()
        hosts.close()


if __name__ == "__main__":
    main()
