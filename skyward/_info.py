"""``InstanceInfo``: what a worker knows about its place in the pool.

The client builds one per worker after every worker has said ``Hello`` and sends it in
``Start``; the worker keeps it for ``instance_info()``. A pool runs one worker per node unless
``workers_per_node`` asks for more; each worker then has its own rank over the pool
(``global_worker_index``), its rank on its node (``worker``) and the GPUs it owns
(``devices``). Outside a worker (the client, or a function run with ``f.local()``)
``instance_info()`` describes the current process as the only worker of a one-node pool, so
code that shards by rank runs unchanged.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import operator
import re
import socket
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# "A100", "A100:8", "A100-80GB:8": the pool's accelerator as the catalog writes it.
_ACCELERATOR = re.compile(r"^(?P<name>.+?)(?:-(?P<memory>\d+)GB)?(?::(?P<count>\d+))?$")
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


class _Readable:
    """``value["key"]``, ``value.get("key")`` and ``keys()``: how skyward 0.5 read the
    dicts that our values replace."""

    def _fields(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self._fields()[key]
        if isinstance(self, str):
            return str.__getitem__(self, key)  # an index or a slice of the text
        raise TypeError(f"{type(self).__name__} is read by key: {', '.join(self._fields())}")

    def get(self, key: str, default: Any = None) -> Any:
        return self._fields().get(key, default)

    def keys(self) -> Iterator[str]:
        return iter(self._fields())


class Peer(_Readable, str):
    """A node's address, by rank: ``info.peers[i]`` is where node ``i`` is reached (a
    string). It also reads as skyward 0.5's peer dict: ``peer["private_ip"]`` (the
    address), ``peer["node"]``, ``peer.get("public_ip")`` (``None``: not known here)."""

    node: int

    def __new__(cls, address: str, node: int) -> Peer:
        peer = super().__new__(cls, address)
        peer.node = node
        return peer

    def __reduce__(self) -> tuple[Any, ...]:
        return (Peer, (str(self), self.node))

    def _fields(self) -> dict[str, Any]:
        return {"node": self.node, "private_ip": str(self), "public_ip": None}


class AcceleratorName(_Readable, str):
    """The pool's accelerator as it asked for it (``"A100:8"``, a string), also readable
    as skyward 0.5's accelerator dict: ``["type"]`` (``"A100"``), ``["count"]`` (devices on
    this node, else the count asked for), ``["memory_gb"]`` (when the request pinned it),
    ``["is_trainium"]``."""

    devices: int

    def __new__(cls, text: str, devices: int) -> AcceleratorName:
        name = super().__new__(cls, text)
        name.devices = devices
        return name

    def __reduce__(self) -> tuple[Any, ...]:
        return (AcceleratorName, (str(self), self.devices))

    def _fields(self) -> dict[str, Any]:
        match = _ACCELERATOR.match(str(self))
        assert match is not None  # the pattern matches any non-empty text
        count = self.devices or int(match["count"] or 0)
        fields: dict[str, Any] = {"type": match["name"], "count": count, "is_trainium": False}
        if match["memory"]:
            fields["memory_gb"] = float(match["memory"])
        return fields


@dataclass(frozen=True)
class Network(_Readable):
    """How this node is reached: ``address`` (its entry in ``peers``), the ``interface``
    that holds it (``"eth0"``; ``None`` when no interface of this machine has that address,
    as behind NAT), and that interface's ``bandwidth_gbps`` as the kernel reports its link
    speed (``None`` where it reports none: loopback, most cloud NICs). Read as attributes or,
    as skyward 0.5 did, as keys (``info.network["interface"]``)."""

    address: str
    interface: str | None
    bandwidth_gbps: float | None

    def _fields(self) -> dict[str, Any]:
        return {
            "interface": self.interface,
            "bandwidth_gbps": self.bandwidth_gbps,
            "address": self.address,
        }


def network_of(address: str, sys_root: str = "/sys") -> Network:
    """The interface of this machine that holds ``address``, and its link speed."""
    interface = _interface_of(address)
    speed: float | None = None
    if interface is not None:
        try:
            with open(f"{sys_root}/class/net/{interface}/speed") as f:
                megabits = int(f.read().strip())
            speed = megabits / 1000 if megabits > 0 else None
        except (OSError, ValueError):
            speed = None  # loopback and virtual NICs have none
    return Network(address, interface, speed)


def _interface_of(address: str) -> str | None:
    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        try:
            wanted = ipaddress.ip_address(socket.gethostbyname(address))
        except (OSError, ValueError):
            return None
    if wanted.is_loopback:
        return "lo" if _has_interface("lo") else None
    try:
        import fcntl  # POSIX only
    except ImportError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(
                    probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15])
                )
            except OSError:
                continue  # no IPv4 address
            if ipaddress.ip_address(socket.inet_ntoa(raw[20:24])) == wanted:
                return name
    return None


def _has_interface(name: str) -> bool:
    try:
        return any(n == name for _, n in socket.if_nameindex())
    except OSError:
        return False


def worker_label(node: int, worker: int, workers_per_node: int) -> str:
    """How every message, print prefix and report names a worker, on either side of the
    wire: ``node 2``, or with several workers per node ``node 2 worker 1`` (its index on
    the node)."""
    return f"node {node}" if workers_per_node == 1 else f"node {node} worker {worker}"


@dataclass(frozen=True, kw_only=True)
class InstanceInfo:
    """A worker's identity in its pool. Frozen; identical on every worker but ``node``,
    ``worker``, ``devices``, ``accelerators`` and ``hostname``.

    - ``node``: this node's rank, ``0 .. total_nodes - 1``.
    - ``head_addr`` / ``head_port``: where node 0 can be reached by the other nodes, and a
      port node 0 found free at start (the jax plugin puts its coordinator there).
    - ``peers``: every node's address, by rank (``peers[0] == head_addr``); each also reads
      as skyward 0.5's peer dict (``peers[i]["private_ip"]``, see ``Peer``).
    - ``accelerators``: accelerator devices on this node (0 on CPU-only nodes);
      ``accelerator``: their kind, as the pool asked for it (``"A100"``, ``"A100:8"``), or
      ``None``; also readable as 0.5's dict (``accelerator["type"]``, see
      ``AcceleratorName``).
    - ``network``: this node's address, the interface that holds it and its speed, looked
      up on the node when read (``Network``).
    - ``total_accelerators``: accelerator devices on every node together.
    - ``pool``, ``provider``: the pool's name and the provider's kind (``"local"``);
      ``job_id``: this pool's run, unique (a restarted worker keeps it).
    - ``worker`` / ``workers_per_node``: this worker's rank on its node (torch's
      ``LOCAL_RANK``) and how many workers each node runs (``LOCAL_WORLD_SIZE``): ``0`` / ``1``
      unless the pool has ``workers_per_node``. ``global_worker_index`` (``RANK``) and
      ``total_workers`` (``WORLD_SIZE``) count over the pool, node-major.
    - ``devices``: the node's GPUs this worker owns, as indices among the node's own (with
      several workers per node each sees only these: ``CUDA_VISIBLE_DEVICES`` is set to them
      before any plugin or call runs, so its first GPU is ``cuda:0``); empty on CPU nodes.

    A frozen dataclass, not a pydantic model: every worker unpickles one at start, and
    pydantic would cost each start most of its time (``docs/performance.md``). It is checked
    when made, as a pydantic model would be: a wrong value raises pydantic's
    ``ValidationError`` naming the field (pydantic is imported only then), and
    ``model_copy`` / ``model_dump`` work as they did.
    """

    node: int
    total_nodes: int
    head_addr: str
    head_port: int
    peers: tuple[str, ...]
    accelerators: int = 0
    total_accelerators: int = -1  # -1: accelerators x total_nodes
    accelerator: str | None = None
    pool: str | None = None
    job_id: str = ""
    provider: str = "local"
    hostname: str
    worker: int = 0
    workers_per_node: int = 1
    devices: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        set_field = object.__setattr__  # frozen: these are the values it is made with
        errors: list[_Error] = []
        for name, low, high in _INT_RANGES:
            value = getattr(self, name)
            try:
                value = operator.index(value)  # an int, or an int-like (numpy's)
            except TypeError:
                errors.append(_Error("int_type", name, value))
                continue
            if isinstance(value, bool):
                errors.append(_Error("int_type", name, value))
            elif value < low:
                errors.append(_Error("greater_than_equal", name, value, {"ge": low}))
            elif high is not None and value > high:
                errors.append(_Error("less_than_equal", name, value, {"le": high}))
            else:
                set_field(self, name, int(value))
        for name in ("head_addr", "hostname", "job_id", "provider"):
            if not isinstance(getattr(self, name), str):
                errors.append(_Error("string_type", name, getattr(self, name)))
        for name in ("accelerator", "pool"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                errors.append(_Error("string_type", name, value))
        if isinstance(self.peers, str) or not all(isinstance(p, str) for p in self.peers):
            errors.append(_Error("tuple_type", "peers", self.peers))
        if isinstance(self.devices, str) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in self.devices
        ):
            errors.append(_Error("tuple_type", "devices", self.devices))
        if errors:
            raise _invalid(errors)
        problem = self._layout_problem()
        if problem is not None:
            raise _invalid([_Error.value_error(*problem)])
        if self.total_accelerators == -1:  # not given: every node like this one
            set_field(self, "total_accelerators", self.accelerators * self.total_nodes)
        # Readable in skyward 0.5's shapes too (see Peer, AcceleratorName).
        set_field(self, "peers", tuple(Peer(str(a), rank) for rank, a in enumerate(self.peers)))
        set_field(self, "devices", tuple(self.devices))
        if self.accelerator is not None:
            set_field(
                self, "accelerator", AcceleratorName(str(self.accelerator), self.accelerators)
            )

    def _layout_problem(self) -> tuple[str, object] | None:
        """What does not fit the pool's layout, once each field is right, and its value."""
        if self.worker >= self.workers_per_node:
            return (
                f"worker {self.worker} is out of range for {self.workers_per_node} per node",
                self.worker,
            )
        if self.node >= self.total_nodes:
            return f"node {self.node} is out of range for {self.total_nodes} nodes", self.node
        if len(self.peers) != self.total_nodes:
            return f"peers has {len(self.peers)} entries for {self.total_nodes} nodes", self.peers
        return None

    @classmethod
    def current(cls) -> InstanceInfo:
        """skyward 0.5's spelling of ``sky.instance_info()``: this worker's info, or outside
        a pool a one-node description of this process (``info.pool is None`` there; 0.5
        returned ``None``)."""
        return instance_info()

    @property
    def is_head(self) -> bool:
        """The pool's first worker (node 0's first): one of them, whatever the layout."""
        return self.node == 0 and self.worker == 0

    @property
    def global_worker_index(self) -> int:
        """This worker's rank over the whole pool, node-major: ``node * workers_per_node +
        worker`` (equal to ``node`` with one worker per node)."""
        return self.node * self.workers_per_node + self.worker

    @property
    def total_workers(self) -> int:
        return self.total_nodes * self.workers_per_node

    @property
    def network(self) -> Network:
        """This node's address, its interface and link speed (see ``Network``); looked up
        on the machine that reads it, so read it on the node."""
        return network_of(self.peers[self.node])

    def model_copy(self, *, update: Mapping[str, Any] | None = None) -> InstanceInfo:
        """A copy with ``update``'s fields changed, checked as a new one is."""
        return dataclasses.replace(self, **(update or {}))

    def model_dump(self) -> dict[str, Any]:
        """The fields, and ``is_head``, as a dict."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**fields, "is_head": self.is_head}


# name, lowest, highest (None: no bound) of each whole-number field
_INT_RANGES: tuple[tuple[str, int, int | None], ...] = (
    ("node", 0, None),
    ("total_nodes", 1, None),
    ("head_port", 0, 65535),
    ("accelerators", 0, None),
    ("total_accelerators", -1, None),
    ("worker", 0, None),
    ("workers_per_node", 1, None),
)


@dataclass(frozen=True)
class _Error:
    """One wrong value, as pydantic reports it: its error type, field, value and context."""

    kind: str
    field: str | None
    value: object
    context: dict[str, object] | None = None

    @staticmethod
    def value_error(message: str, value: object) -> _Error:
        return _Error("value_error", None, value, {"error": ValueError(message)})


def _invalid(errors: list[_Error]) -> ValueError:
    """pydantic's ``ValidationError`` for ``errors`` (a ``ValueError``), pydantic imported
    only now: a worker, which only unpickles infos, never loads it."""
    from pydantic_core import InitErrorDetails, ValidationError

    details: list[InitErrorDetails] = []
    for error in errors:
        detail: InitErrorDetails = {
            "type": error.kind,
            "loc": () if error.field is None else (error.field,),
            "input": error.value,
        }
        if error.context is not None:
            detail["ctx"] = error.context
        details.append(detail)
    return ValidationError.from_exception_data("InstanceInfo", details)


_current: InstanceInfo | None = None


def instance_info() -> InstanceInfo:
    """This node's ``InstanceInfo``.

    On a worker, the info the client sent at start. Anywhere else (the client, a function
    run with ``f.local()``), a one-node description of the current process: node 0 of 1,
    loopback head, ``pool=None``. Never ``None``, unlike skyward 0.5's, so code that shards
    by ``node``/``total_nodes`` runs unchanged outside a pool; ``info.pool is None`` says
    that it is outside one.
    """
    if _current is not None:
        return _current
    return InstanceInfo(
        node=0,
        total_nodes=1,
        head_addr="127.0.0.1",
        head_port=0,
        peers=("127.0.0.1",),
        pool=None,
        job_id="local",
        provider="local",
        hostname=socket.gethostname(),
    )


def _set_current(info: InstanceInfo) -> None:
    global _current
    _current = info
