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

The network between them is modelled (``--no-shaping`` leaves the bed as it is: a
local index and store on the hosts' own bridge, no latency, no rate but the servers' own
CPU). Per host, what it receives from the index and from the store is shaped apart (HTB
on the bridge side of its veth, classes by the server's port; connections hashed on
their port into 64 classes, each capped at the per-connection rate), and a relay in front
of each server adds the round trip to every connection's set-up and every request (this
kernel has no netem). The defaults, from documented figures, conservative toward the
cache where a figure was missing (the index given the higher rate, the store the lower):

    store: 680 mbit per connection (85 MB/s: the low end of "one concurrent request for
           each 85-90 MB/s of desired network throughput", with 8-16 MB ranges, in
           Amazon S3's performance guidelines, docs.aws.amazon.com/AmazonS3/latest/
           userguide/optimizing-performance-guidelines.html; Google's "sliced object
           downloads" page says the same of GCS without a figure), 5 gbit per node
    index: 800 mbit per connection (PyPI's files come from Fastly, with a 99 % cache-hit
           ratio, fastly.com/customers/python-software-foundation; nothing documents a
           rate per connection: 100 MB/s is the top of the 50-100 MB/s an InvokeAI
           maintainer reports for torch from PyPI, github.com/invoke-ai/InvokeAI/
           issues/3146), 5 gbit per node (an EC2 instance with fewer than 32 vCPUs gets
           at most 5 Gbps through an internet gateway and 5 Gbps per flow,
           docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth
           .html; uv opens up to 50 downloads at once, UV_CONCURRENT_DOWNLOADS)
    both:  10 ms round trip (an assumption: nothing found documents either; the same for
           both, so latency gives the cache no edge, though a store in the node's region
           is usually nearer than a CDN's edge)

With these rates the network is not what limits either start in this bed: a node gets
each server's whole environment in about a second at most (jaxlib's 85 MB wheel comes
down one connection: 0.85 s at 800 mbit; the 146 MB entry over 8: about 0.25 s), and
both starts are bound by the CPU (uv unpacking wheels, or ``zstd -d | tar -x``) on this
machine's 2 shared cores. What the model adds is each request's round trip and the
per-connection caps.

The stores are test servers, and their costs are theirs: moto answers each ranged GET by
reading the whole object and slicing it (a 146 MB entry in 16 MB ranges takes it 4.5 s,
where the GCS emulator serves it in about 1 s), and the GCS emulator takes about 20 s to
accept an upload of that size (it parses the multipart body and checksums it in Python).
So the cached rows are closest to a real store's with the GCS emulator, and the cold rows'
``publish`` is longest there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
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


# ── the network model ────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Link:
    """What each host receives from one server (the index, or the store): the bandwidth
    its node gets from that server in all (``rate``), the most one connection gets
    (``per_connection``), both in tc's units ("5gbit", "" for no limit), and the round trip
    added to each connection's set-up and to each request (``rtt``, seconds)."""

    rate: str = ""
    per_connection: str = ""
    rtt: float = 0.0

    @property
    def shaped(self) -> bool:
        return bool(self.rate or self.per_connection)

    def __str__(self) -> str:
        if not self.shaped and not self.rtt:
            return "unshaped"
        return (
            f"{self.rate or 'any rate'} per node, {self.per_connection or 'any rate'} per "
            f"connection, {self.rtt * 1000:g} ms round trip"
        )


# Connections are spread over this many HTB classes by their port (tc here has no fq or
# sfq to cap each flow): two connections in one bucket share its per-connection rate.
_BUCKETS = 64


class _Shaping:
    """HTB on the bridge side of each host's veth (its egress is what the host receives):
    a class per server, matched by the server's source port, and under it ``_BUCKETS``
    classes hashed on the host's port, each capped at the per-connection rate. Anything
    else (SSH, the workers) is not shaped. ``remove`` deletes the root qdisc it added; the
    veths are the benchmark's own (``Hosts``), and they go with ``Hosts.close`` anyway."""

    def __init__(self, veths: list[str], server: str, links: dict[int, Link]) -> None:
        self.veths: list[str] = []
        try:
            for veth in veths:
                self.veths.append(veth)
                _tc_batch(_shaping_commands(veth, server, links))
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        for veth in self.veths:
            subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], capture_output=True)
        self.veths = []


def _shaping_commands(veth: str, server: str, links: dict[int, Link]) -> list[str]:
    burst = "burst 512k cburst 512k quantum 60000"
    lines = [f"qdisc add dev {veth} root handle 1: htb r2q 1000"]
    for number, (port, link) in enumerate(sorted(links.items()), start=1):
        if not link.shaped:
            continue
        top = f"1:{number:x}0"
        rate = link.rate or "100gbit"
        lines.append(f"class add dev {veth} parent 1: classid {top} htb rate {rate} {burst}")
        match = f"match ip src {server}/32 match ip sport {port} 0xffff"
        if not link.per_connection:
            lines.append(
                f"filter add dev {veth} parent 1: prio 1 protocol ip u32 {match} flowid {top}"
            )
            continue
        table = f"{number:x}00:"
        lines.append(
            f"filter add dev {veth} parent 1: prio 1 handle {table} protocol ip u32 "
            f"divisor {_BUCKETS}"
        )
        # The word at offset 20 holds the source and destination ports (no IP options).
        lines.append(
            f"filter add dev {veth} parent 1: prio 1 protocol ip u32 ht 800:: {match} "
            f"hashkey mask 0x{_BUCKETS - 1:08x} at 20 link {table}"
        )
        for bucket in range(_BUCKETS):
            leaf = f"1:{number:x}{bucket + 0x100:x}"
            lines.append(
                f"class add dev {veth} parent {top} classid {leaf} htb rate 1mbit "
                f"ceil {link.per_connection} {burst}"
            )
            lines.append(
                f"filter add dev {veth} parent 1: prio 1 protocol ip u32 "
                f"ht {number:x}00:{bucket:x}: match u32 0 0 flowid {leaf}"
            )
    return lines


def _tc_batch(lines: list[str]) -> None:
    done = subprocess.run(
        ["tc", "-batch", "-"], input="\n".join(lines) + "\n", capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"tc -batch failed: {done.stderr.strip()[-500:]}")


class _Relay:
    """A TCP relay on the bridge in front of one server, adding a round trip: each
    connection is opened ``rtt`` late (the handshake) and every byte a host sends is
    forwarded ``rtt`` after it arrived (so each request waits a round trip, and an upload
    streams at full speed, only later). The answers go back through ``os.splice``, without
    being copied through Python. This kernel has no netem, so the delay is made here."""

    def __init__(self, host: str, upstream: int, rtt: float) -> None:
        self.host, self.upstream, self.rtt = host, upstream, rtt
        self._listener = socket.create_server((host, 0), backlog=256)
        self.port = int(self._listener.getsockname()[1])
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()  # guards: _open
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        time.sleep(self.rtt)
        try:
            server = socket.create_connection((self.host, self.upstream))
        except OSError:
            client.close()
            return
        for end in (client, server):
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._open.update((client, server))
        late = queue.SimpleQueue[tuple[float, bytes]]()
        threads = [
            threading.Thread(target=self._receive, args=(client, late), daemon=True),
            threading.Thread(target=self._send_late, args=(late, server), daemon=True),
        ]
        for thread in threads:
            thread.start()
        self._splice(server, client)
        for thread in threads:
            thread.join()
        with self._lock:
            self._open.difference_update((client, server))
        client.close()
        server.close()

    @staticmethod
    def _receive(source: socket.socket, late: queue.SimpleQueue[tuple[float, bytes]]) -> None:
        while True:
            try:
                data = source.recv(1 << 20)
            except OSError:
                data = b""
            late.put((time.monotonic(), data))
            if not data:
                return

    def _send_late(self, late: queue.SimpleQueue[tuple[float, bytes]], to: socket.socket) -> None:
        while True:
            arrived, data = late.get()
            time.sleep(max(0.0, arrived + self.rtt - time.monotonic()))
            try:
                if not data:
                    to.shutdown(socket.SHUT_WR)
                    return
                to.sendall(data)
            except OSError:
                return

    @staticmethod
    def _splice(source: socket.socket, to: socket.socket) -> None:
        read, write = os.pipe()
        try:
            while True:
                moved = os.splice(source.fileno(), write, 1 << 20)
                if moved == 0:
                    break
                while moved:
                    moved -= os.splice(read, to.fileno(), moved)
            to.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            os.close(read)
            os.close(write)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for end in self._open:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)


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
    """New hosts, their index and a store on their bridge, and the network model between
    them: relays adding the round trips, tc shaping what each host receives."""

    def __init__(self, nodes: int, store: str, index_link: Link, store_link: Link) -> None:
        self.hosts = Hosts.start(nodes)
        self.index: PackageIndex | None = None
        self.s3: S3Server | GCSServer | AzuriteServer | None = None
        self.relays: list[_Relay] = []
        self.shaping: _Shaping | None = None
        try:
            address = self.hosts.bridge_address
            self.index = PackageIndex(self.hosts.root / "index", address)
            self.index.add(sorted(_WHEELS.glob("*.whl")))
            self.s3 = _STORES[store](address)
            self.hosts.set_environment(self.s3.env)
            self.index_port = self._relay(_port(self.index.url), index_link)
            self.store_port = self._relay(_port(self.s3.url), store_link)
            links = {self.index_port: index_link, self.store_port: store_link}
            if index_link.shaped or store_link.shaped:
                veths = [h.veth for h in self.hosts.hosts]
                self.shaping = _Shaping(veths, address, links)
        except BaseException:
            self.close()
            raise

    def _relay(self, port: int, link: Link) -> int:
        if not link.rtt:
            return port
        relay = _Relay(self.hosts.bridge_address, port, link.rtt)
        self.relays.append(relay)
        return relay.port

    def image(self, prefix: str | None) -> sky.Image:
        assert self.index is not None and self.s3 is not None
        cache = {} if prefix is None else {"cache": self.s3.cache_url(prefix)}
        return sky.Image(
            pip=ENVIRONMENT,
            index_url=_with_port(self.index.url, self.index_port),
            cache_endpoint=_with_port(self.s3.url, self.store_port),
            **cache,
        )

    def entry_size(self, prefix: str) -> int:
        assert self.s3 is not None
        (key,) = self.s3.keys(prefix)
        return len(self.s3.read(key)[0])

    def close(self) -> None:
        if self.shaping is not None:
            self.shaping.remove()
        for relay in self.relays:
            relay.close()
        if self.s3 is not None:
            self.s3.close()
        if self.index is not None:
            self.index.close()
        self.hosts.close()


def _port(url: str) -> int:
    port = urllib.parse.urlsplit(url).port
    assert port is not None
    return port


def _with_port(url: str, port: int) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts._replace(netloc=f"{parts.hostname}:{port}").geturl()


def _round(nodes: int, store: str, links: tuple[Link, Link]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    bed = _Bed(nodes, store, *links)
    try:
        rows["uncached"] = _start(bed.hosts, nodes, bed.image(None))
    finally:
        bed.close()
    bed = _Bed(nodes, store, *links)
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


def _rate(text: str) -> str:
    return "" if text.strip() in ("", "0") else text.strip()


def _seconds(text: str) -> float:
    text = text.strip()
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    return float(text.removesuffix("s"))


def _links(options: argparse.Namespace) -> tuple[Link, Link]:
    if options.no_shaping:
        return Link(), Link()
    return (
        Link(
            _rate(options.index_rate), _rate(options.index_conn_rate), _seconds(options.index_rtt)
        ),
        Link(
            _rate(options.store_rate), _rate(options.store_conn_rate), _seconds(options.store_rtt)
        ),
    )


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
    model = parser.add_argument_group(
        "network model (per host; see the docstring for where the defaults come from)"
    )
    model.add_argument("--index-rate", default="5gbit", help="from the index, per node")
    model.add_argument("--index-conn-rate", default="800mbit", help="per index connection")
    model.add_argument("--index-rtt", default="10ms", help="round trip to the index")
    model.add_argument("--store-rate", default="5gbit", help="from the store, per node")
    model.add_argument("--store-conn-rate", default="680mbit", help="per store connection")
    model.add_argument("--store-rtt", default="10ms", help="round trip to the store")
    model.add_argument(
        "--no-shaping",
        action="store_true",
        help="the bed as it is: no rates, no added round trips (a rate or round trip of 0 "
        "turns that one off)",
    )
    options = parser.parse_args()
    links = _links(options)
    print(f"index: {links[0]}; store: {links[1]}", file=sys.stderr, flush=True)
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
                results[nodes].append(_round(nodes, options.store, links))
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
    load = Path("/proc/loadavg").read_text().split()[:3]
    table = _table(results)
    table += f"\n\nindex: {links[0]}; store: {links[1]}; load average at the end: {' '.join(load)}"
    print(table)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (out / f"envcache-{options.store}-{stamp}.json").write_text(json.dumps(results, indent=1))
    (out / f"envcache-{options.store}-{stamp}.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
