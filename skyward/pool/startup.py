"""The start-up barrier: Hello → InstanceInfo → Start → Ready, for every node or some.

::

    per node, in parallel:   spawn a worker → wait Hello (Python version, hostname, and on
                             node 0 a free port for plugins such as jax's coordinator)
    on the client:           check versions → one InstanceInfo per node
    barrier:                 Start to every node only once all have said Hello, so plugins
                             (jax.distributed.initialize) begin together however unevenly
                             the machines booted
    per node, in parallel:   wait Ready (the plugins' around_app entered)

Everything is bounded by one ``Deadline`` (``start_timeout``). A restart of some nodes gives
their new workers the InstanceInfo their nodes already have, so they rejoin the same pool.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Sequence

from skyward._errors import VersionMismatch
from skyward._futures import Deadline, parallel
from skyward._image import Image
from skyward._info import InstanceInfo
from skyward._phases import Reporter
from skyward.link import protocol as proto
from skyward.link.channel import Channel
from skyward.pool.scheduler import Slot
from skyward.pool.spec import PoolSpec


class Startup:
    """Brings workers up through the barrier. ``open_channel(slot)`` spawns a worker on the
    slot's node and returns its channel (the pool records it, so a close can end it)."""

    def __init__(
        self,
        spec: PoolSpec,
        *,
        image: Image,
        plugins: proto.Parts,
        reporter: Reporter,
        open_channel: Callable[[Slot], Channel],
    ) -> None:
        self._spec = spec
        self._image = image  # after the plugins' transforms
        self._plugins = plugins
        self._reporter = reporter
        self._open_channel = open_channel
        self._hooked = [p.name for p in spec.plugins if p.around_app is not None]
        # One per pool: workers started again after a loss keep it.
        self._job_id = f"{spec.name}-{secrets.token_hex(4)}"
        # The secret peers present on each other's relay ports (skyward.worker.relay); one per
        # pool, sent over each node's own link.
        self._relay_key = secrets.token_bytes(32)

    def bring_up(
        self,
        slots: Sequence[Slot],
        deadline: Deadline,
        *,
        whole_pool: bool,
        launched: list[Channel] | None = None,
    ) -> list[Channel]:
        """Start a worker on each of ``slots`` and wait until all are Ready.

        With ``whole_pool`` (start, or a restart of every node) each node's InstanceInfo is
        built afresh from the Hellos. Each channel opened is also put in ``launched``, so a
        caller can end them all when this fails part-way.
        """

        def hello(slot: Slot) -> tuple[Channel, proto.Hello]:
            self._reporter.phase(slot.rank, "starting")
            channel = self._open_channel(slot)
            if launched is not None:
                launched.append(channel)
            return channel, channel.wait_hello(deadline)

        hellos = parallel(hello, slots)
        for slot, (_, message) in zip(slots, hellos, strict=True):
            check_version(slot.rank, message)
        if whole_pool:
            for slot, info in zip(slots, self._infos(slots, hellos), strict=True):
                slot.info = info
        if self._hooked:
            names = ", ".join(self._hooked)
            self._reporter.status(f"entering plugins on every node: {names}")
            for slot in slots:  # the progress row says what the node is waiting for now
                self._reporter.phase(slot.rank, "starting", f"entering {names}")
        for slot, (channel, _) in zip(slots, hellos, strict=True):
            channel.send_start(self._start_message(slot), self._plugins)

        def ready(pair: tuple[Slot, Channel]) -> None:
            slot, channel = pair
            channel.wait_ready(deadline)
            self._reporter.phase(slot.rank, "ready", f"pid {channel.pid}")

        channels = [channel for channel, _ in hellos]
        parallel(ready, list(zip(slots, channels, strict=True)))
        return channels

    def _infos(
        self, slots: Sequence[Slot], hellos: Sequence[tuple[Channel, proto.Hello]]
    ) -> list[InstanceInfo]:
        spec = self._spec
        head_port = hellos[0][1].head_port or 0
        addresses = tuple(slot.node.address for slot in slots)
        total_accelerators = sum(slot.node.accelerators for slot in slots)
        return [
            InstanceInfo(
                node=slot.rank,
                total_nodes=spec.nodes,
                head_addr=addresses[0],
                head_port=head_port,
                peers=addresses,
                accelerators=slot.node.accelerators,
                total_accelerators=total_accelerators,
                accelerator=spec.accelerator,
                pool=spec.name,
                job_id=self._job_id,
                provider=spec.provider_kind,
                hostname=message.hostname,
            )
            for slot, (_, message) in zip(slots, hellos, strict=True)
        ]

    def _start_message(self, slot: Slot) -> proto.Start:
        assert slot.info is not None
        # Nodes that do not share the client's machine relay large broadcasts between
        # them (the client's link is then the slow one); local workers never do.
        relays = not slot.node.shares_files and self._spec.nodes > 1
        return proto.Start(
            info=slot.info,
            sys_path=(
                client_sys_path() + self._image.include_roots() if slot.node.shares_files else []
            ),
            concurrency=self._spec.concurrency,
            executor=self._spec.executor,
            relay_key=self._relay_key if relays else b"",
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
