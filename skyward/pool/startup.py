"""The start-up barrier: Hello → InstanceInfo → Start → Ready, for every worker or some.

::

    per worker, in parallel: spawn it on its node → wait Hello (Python version, hostname,
                             and from worker 0 a free port on node 0 for plugins such as
                             jax's coordinator)
    on the client:           check versions → one InstanceInfo per worker
    barrier:                 Start to every worker only once all have said Hello, so plugins
                             (jax.distributed.initialize) begin together however unevenly
                             the machines booted
    per worker, in parallel: wait Ready (the plugins' around_app entered)

Workers go by rank (one per node, or ``workers_per_node`` on each, node-major: see
``Layout``). Everything is bounded by one ``Deadline`` (``start_timeout``). A restart of some
workers gives the new ones the InstanceInfo their ranks already have (with a new address, if
their node got a new machine), so they rejoin the same pool. Startup owns those
InstanceInfos; where each node is, and which node each rank is on, it asks ``Machines``. A node an
autoscaling pool adds is told the pool as it is when it joins (the same head, every node so
far as its peers).
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

from skyward._errors import VersionMismatch
from skyward._image import Image
from skyward._info import InstanceInfo
from skyward.client.futures import Deadline, parallel
from skyward.client.phases import Reporter
from skyward.link import protocol as proto
from skyward.link.channel import Channel
from skyward.pool.machines import Machines
from skyward.pool.spec import PoolSpec


class Startup:
    """Brings workers up through the barrier. ``open_channel(rank)`` spawns worker ``rank`` on
    its node and returns its channel (the pool's ``_open``: it records the worker, so that a
    close can end it)."""

    def __init__(
        self,
        spec: PoolSpec,
        *,
        image: Image,
        plugins: proto.Parts,
        reporter: Reporter,
        machines: Machines,
        open_channel: Callable[[int], Channel],
    ) -> None:
        self._spec = spec
        self._image = image  # after the plugins' transforms
        self._plugins = plugins
        self._reporter = reporter
        self._machines = machines
        self._open_channel = open_channel
        self._hooked = [p.name for p in spec.plugins if p.around_app is not None]
        # One per pool: workers started again after a loss keep it.
        self._job_id = f"{spec.name}-{secrets.token_hex(4)}"
        # The secret peers present on each other's relay ports (skyward.worker.relay); one per
        # pool, sent over each node's own link.
        self._relay_key = secrets.token_bytes(32)
        self._lock = threading.Lock()  # guards: _infos
        self._infos: dict[int, InstanceInfo] = {}  # by rank: what each worker is told

    def use(self, spec: PoolSpec, image: Image) -> None:
        """The pool fell back to another ``sky.Spec``: its options and image, before any
        worker starts."""
        self._spec, self._image = spec, image
        self._hooked = [p.name for p in spec.plugins if p.around_app is not None]

    def bring_up(
        self,
        ranks: Sequence[int],
        deadline: Deadline,
        *,
        whole_pool: bool,
        launched: list[Channel] | None = None,
    ) -> list[Channel]:
        """Start the workers of ``ranks`` and wait until all are Ready; their channels, in
        the same order.

        With ``whole_pool`` (start, or a restart of every worker) each worker's InstanceInfo
        is built afresh from the Hellos. Each channel opened is also put in ``launched``, so
        a caller can end them all when this fails part-way.
        """
        layout = self._machines.layout

        def hello(rank: int) -> tuple[Channel, proto.Hello]:
            self._reporter.phase(layout.node_of(rank), "starting")
            channel = self._open_channel(rank)
            if launched is not None:
                launched.append(channel)
            return channel, channel.wait_hello(deadline)

        hellos = parallel(hello, ranks)
        for rank, (_, message) in zip(ranks, hellos, strict=True):
            check_version(rank, message)
        if whole_pool:
            infos = self._new_infos(ranks, [message for _, message in hellos])
            with self._lock:
                self._infos.update(zip(ranks, infos, strict=True))
        else:
            with self._lock:
                joining = [i for i, rank in enumerate(ranks) if rank not in self._infos]
            if joining:
                infos = self._join_infos(
                    [ranks[i] for i in joining], [hellos[i][1] for i in joining]
                )
                with self._lock:
                    self._infos.update(zip([ranks[i] for i in joining], infos, strict=True))
        if self._hooked:
            names = ", ".join(self._hooked)
            self._reporter.status(f"entering plugins on every node: {names}")
            for node in sorted({layout.node_of(rank) for rank in ranks}):
                # the progress row says what the node is waiting for now
                self._reporter.phase(node, "starting", f"entering {names}")
        for rank, (channel, _) in zip(ranks, hellos, strict=True):
            channel.send_start(self._start_message(rank), self._plugins)

        def ready(pair: tuple[int, Channel]) -> None:
            rank, channel = pair
            channel.wait_ready(deadline)
            worker = "" if layout.per_node == 1 else f"worker {layout.local_of(rank)} "
            self._reporter.phase(layout.node_of(rank), "ready", f"{worker}pid {channel.pid}")

        channels = [channel for channel, _ in hellos]
        parallel(ready, list(zip(ranks, channels, strict=True)))
        return channels

    def _new_infos(self, ranks: Sequence[int], hellos: Sequence[proto.Hello]) -> list[InstanceInfo]:
        """Every worker's InstanceInfo (``ranks`` are all of them, in order)."""
        spec = self._spec
        layout = self._machines.layout
        machines = [self._machines.node(node) for node in range(layout.nodes)]
        head_port = hellos[0].head_port or 0
        addresses = tuple(machine.address for machine in machines)
        total_accelerators = sum(machine.accelerators for machine in machines)
        infos = []
        for rank, message in zip(ranks, hellos, strict=True):
            node = layout.node_of(rank)
            gpus = machines[node].accelerators
            infos.append(
                InstanceInfo(
                    node=node,
                    total_nodes=layout.nodes,  # an autoscaling pool's start: its min
                    head_addr=addresses[0],
                    head_port=head_port,
                    peers=addresses,
                    accelerators=gpus,
                    total_accelerators=total_accelerators,
                    accelerator=spec.accelerator,
                    pool=spec.name,
                    job_id=self._job_id,
                    provider=spec.provider_kind,
                    hostname=message.hostname,
                    worker=layout.local_of(rank),
                    workers_per_node=layout.per_node,
                    devices=layout.devices(rank, gpus),
                )
            )
        return infos

    def _join_infos(
        self, ranks: Sequence[int], hellos: Sequence[proto.Hello]
    ) -> list[InstanceInfo]:
        """InstanceInfos for nodes an autoscaling pool adds: node 0 stays the head, and the
        pool is every node up to the last one joining."""
        with self._lock:
            head = self._infos[0]
        size = max(ranks) + 1
        machines = [self._machines.node(rank) for rank in range(size)]
        peers = tuple(machine.address for machine in machines)
        total_accelerators = sum(machine.accelerators for machine in machines)
        return [
            head.model_copy(
                update={
                    "node": rank,
                    "total_nodes": size,
                    "peers": peers,
                    "head_addr": peers[0],
                    "accelerators": machines[rank].accelerators,
                    # one worker per node (autoscaling needs it): the node's every GPU
                    "devices": tuple(range(machines[rank].accelerators)),
                    "total_accelerators": total_accelerators,
                    "hostname": message.hostname,
                }
            )
            for rank, message in zip(ranks, hellos, strict=True)
        ]

    def forget(self, rank: int) -> None:
        """Node ``rank`` left the pool (autoscaling): a node added later in its place is
        told afresh."""
        with self._lock:
            self._infos.pop(rank, None)

    def _info(self, rank: int, address: str) -> InstanceInfo:
        """Worker ``rank``'s InstanceInfo; a worker whose node is on a new machine is told
        its node's new address."""
        with self._lock:
            info = self._infos[rank]
            if info.peers[info.node] != address:
                peers = list(info.peers)
                peers[info.node] = address
                info = replace(info, peers=tuple(peers), head_addr=peers[0])
                self._infos[rank] = info
            return info

    def _start_message(self, rank: int) -> proto.Start:
        node = self._machines.node(self._machines.layout.node_of(rank))
        # Nodes that do not share the client's machine relay large broadcasts between
        # them (the client's link is then the slow one); local workers never do.
        relays = not node.shares_files and self._spec.nodes > 1
        return proto.Start(
            info=self._info(rank, node.address),
            sys_path=(client_sys_path() + self._image.include_roots() if node.shares_files else []),
            concurrency=self._spec.concurrency,
            executor=self._spec.executor,
            relay_key=self._relay_key if relays else b"",
            metrics=tuple(m.wire() for m in self._image.metrics or ()),
        )


def check_version(rank: int, hello: proto.Hello) -> None:
    ours = proto.python_version()
    if hello.python[:2] != ours[:2]:
        theirs = ".".join(map(str, hello.python))
        raise VersionMismatch(
            f"node {rank} runs Python {theirs} but this client runs "
            f"{'.'.join(map(str, ours))}; cloudpickle needs the same minor version on both "
            f"ends. Run the client on Python {hello.python[0]}.{hello.python[1]}, or give "
            f"the workers Python {ours[0]}.{ours[1]}."
        )


def client_sys_path() -> list[str]:
    # Workers append these, so modules importable here (the script's directory, a test
    # suite's rootdir) are importable there too; cloudpickle pickles their functions by name.
    return [os.path.abspath(p or os.curdir) for p in sys.path]
