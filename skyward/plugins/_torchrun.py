"""What torchrun gives each process it starts, given to a pool's worker instead: the torch
plugin's worker side (its ``around_app`` and ``decorate``).

::

    around_app, once per worker                     every call (a torchrun "launch")
    ───────────────────────────────────────         ──────────────────────────────────────
    torchrun's variables -> os.environ              dist.init_process_group()  (wrapped)
    node 0: the pool's TCPStore on head_port          the pool's group? hand it over
    the pool's group (init="auto" / "plugin")         else a new group, rendezvous under
    init/destroy_process_group wrapped                skyward/<n>/ of the pool's store
                                                    dist.destroy_process_group() (wrapped)
                                                    call ends: the group is the pool's
                                                      again (or none, init="program")

Why a store of the pool's, and a fresh key prefix for every group: under torchrun each
launch is a new process, but a pool's worker runs call after call. ``destroy_process_group``
does not free a gloo group that DDP used (its C++ collectives keep a reference), so the group's
TCPStore server on node 0 stays bound to ``MASTER_PORT`` with the group's keys in it; a new
``init_process_group`` on node 0 at the same port gets that same server back (torch shares a
process's servers by port), and the new group's keys have the same names as the old ones
(``0//cpu//0/<rank>``: the group counter restarts after a destroy). The other ranks then
read node 0's old gloo address and node 0 waits in ``ProcessGroupGloo`` for keys that never
change: the hang. Here every group's rendezvous is a prefix of its own (the n-th group a
rank makes is ``skyward/<n>/`` on every rank, as every rank makes the same groups), in one
store that lives as long as the pool, like torchrun's agent store
(``TORCHELASTIC_USE_AGENT_STORE=True``).

Worker-side only; the torch plugin's module (``_torch``) is the client's.
"""

from __future__ import annotations

import datetime
import fcntl
import functools
import inspect
import ipaddress
import os
import socket
import struct
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from skyward._errors import PluginError
from skyward._info import InstanceInfo

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import ProcessGroup, Store

Init = Literal["auto", "plugin", "program"]

# Where the worker's torch state lives while the plugin's around_app runs: set on entry,
# cleared on exit, read by the decorated calls (on the same worker, the main thread).
_current: Groups | None = None


def variables(info: InstanceInfo) -> dict[str, str]:
    """The variables torchrun's agent gives each process it starts (torch's
    ``LocalElasticAgent._start_workers``), for this worker: one rank per worker, one
    torchrun "node" (group) per pool node, one role."""
    rank, world = info.global_worker_index, info.total_workers
    # With several workers per node on GPUs, each worker sees only its own GPUs
    # (CUDA_VISIBLE_DEVICES): torchrun's --virtual-local-rank layout, where LOCAL_RANK is 0
    # so that torch.cuda.set_device(LOCAL_RANK) names the worker's own GPU.
    local = 0 if info.devices and info.workers_per_node > 1 else info.worker
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local),
        "GROUP_RANK": str(info.node),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": str(info.workers_per_node),
        "WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": str(info.total_nodes),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": info.head_addr,
        "MASTER_PORT": str(info.head_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": info.pool or info.job_id or "none",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


class Groups:
    """One worker's process groups: the pool's store, the pool's group, and the wrapped
    ``init_process_group`` / ``destroy_process_group`` that programs call. Used from the
    worker's main thread only (around_app and calls), so it holds no lock."""

    def __init__(self, info: InstanceInfo, *, backend: str, init: Init, init_timeout: int) -> None:
        import torch.distributed as dist

        # torch.distributed.TCPStore, by the module that defines it (torch.distributed
        # re-exports it without naming it in __all__)
        from torch._C._distributed_c10d import TCPStore

        self.tcp_store = TCPStore
        self.info = info
        self.backend = backend
        self.init = init
        self.timeout = datetime.timedelta(seconds=init_timeout)
        self.dist = dist
        self.real_init = dist.init_process_group
        self.real_destroy = dist.destroy_process_group
        self.signature = inspect.signature(self.real_init)
        self.made = 0  # groups this rank made: the n-th is under skyward/<n>/ on every rank
        self.pool_group: ProcessGroup | None = None
        # Every group made in the current call, held until the call has returned: a gloo
        # group's last reference dropped by DDP's Reducer as the call's frame is cleared
        # (holding the GIL) joins gloo's threads while one of them waits for the GIL to
        # finish a work item: a deadlock in torch. Released here, after the call, the
        # threads are idle.
        self.held: list[ProcessGroup] = []
        # Node 0 serves the store for the pool's life (torchrun's agent store); torch shares
        # it with any store node 0 opens on MASTER_PORT.
        self.server: TCPStore | None = None
        if info.global_worker_index == 0:
            self.server = TCPStore(
                info.head_addr,
                info.head_port,
                info.total_workers,
                True,
                self.timeout,
                wait_for_workers=False,
                multi_tenant=True,
            )

    def store(self) -> Store:
        """A new group's rendezvous: a prefix of its own in the pool's store."""
        self.made += 1
        client = self.tcp_store(
            self.info.head_addr, self.info.head_port, self.info.total_workers, False, self.timeout
        )
        return self.dist.distributed_c10d.PrefixStore(f"skyward/{self.made}/", client)

    def make_pool_group(self) -> None:
        info = self.info
        rank = info.global_worker_index
        try:
            self.real_init(
                backend=self.backend,
                store=self.store(),
                rank=rank,
                world_size=info.total_workers,
                timeout=self.timeout,
            )
        except Exception as exc:
            role = "start the process group" if rank == 0 else "join the process group"
            raise PluginError(
                f"torch plugin: rank {rank} (node {info.node}) could not {role} at "
                f"{info.head_addr}:{info.head_port} within {self.timeout.seconds} s "
                f"({self.backend}): {exc}"
            ) from exc
        self.pool_group = self.dist.group.WORLD

    def holds_pool_group(self) -> bool:
        return self.pool_group is not None and self.dist.group.WORLD is self.pool_group

    def init_process_group(self, *args: Any, **kwargs: Any) -> None:
        """``torch.distributed.init_process_group`` on a pool's worker."""
        asked = self.signature.bind(*args, **kwargs).arguments
        if self.holds_pool_group():
            backend = asked.get("backend")
            world = asked.get("world_size", -1)
            same = backend is None or str(backend).lower() == str(self.dist.get_backend())
            if same and world in (-1, self.info.total_workers):
                return None  # the group it asks for is the pool's: it is that group
            if self.init == "plugin":
                raise PluginError(
                    f"torch plugin: this call asks for a {backend} process group, and the "
                    f"pool's (init='plugin') is {self.dist.get_backend()}: give the plugin "
                    f"backend={backend!r}, or init='auto' to let calls make their own"
                )
            self.real_destroy()  # the program's group replaces the pool's for this call
        if asked.get("store") is None and self._rendezvous_at_master(asked.get("init_method")):
            # torchrun's env:// rendezvous, in a prefix of this group's own (the module's
            # docstring says why)
            asked.pop("init_method", None)
            asked["store"] = self.store()
            if asked.get("rank", -1) == -1:
                asked["rank"] = int(os.environ["RANK"])
            if asked.get("world_size", -1) == -1:
                asked["world_size"] = int(os.environ["WORLD_SIZE"])
        self.real_init(**asked)
        if (made := self.dist.group.WORLD) is not None:
            self.held.append(made)
        return None

    def _rendezvous_at_master(self, init_method: str | None) -> bool:
        """Whether a group asked for meets at ``MASTER_ADDR:MASTER_PORT`` (``env://``, the
        default, or a ``tcp://`` URL with the pool's port): in the pool's store, then."""
        if init_method in (None, "env://"):
            return True
        url = urllib.parse.urlparse(init_method)
        return url.scheme == "tcp" and url.port == self.info.head_port

    def destroy_process_group(self, group: ProcessGroup | None = None) -> None:
        """``torch.distributed.destroy_process_group`` on a pool's worker: the pool's group
        stays for the next call."""
        if (group is None or group is self.pool_group) and self.holds_pool_group():
            return
        self.real_destroy(group)

    def call_ended(self) -> None:
        """A call returned: as a launch under torchrun would leave it (no group, with
        init="program"), or with the pool's group again. The group a call made spans every
        rank, so every rank is here: making the pool's group again is safe."""
        if not self.holds_pool_group():
            if self.dist.is_initialized():
                self.real_destroy()
            if self.init != "program":
                self.make_pool_group()
        self.held = [group for group in self.held if group is self.pool_group]

    def close(self) -> None:
        if self.dist.is_initialized():
            self.real_destroy()
        self.pool_group = None
        self.server = None


@contextmanager
def launched(
    info: InstanceInfo, *, backend: str | None, init: Init, init_timeout: int
) -> Iterator[None]:
    """This worker as torchrun would start it, for the life of the block: its variables,
    the pool's store, and (unless ``init="program"``) the pool's group."""
    global _current
    env = variables(info)
    if info.workers_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"  # as torchrun does with nproc_per_node > 1
    os.environ.update(env)
    import torch as torch_module
    import torch.distributed as dist

    chosen = backend or ("nccl" if torch_module.cuda.is_available() else "gloo")
    if chosen == "nccl" and info.devices and torch_module.cuda.is_available():
        # Each worker sees only its own GPUs (CUDA_VISIBLE_DEVICES): its first is cuda:0.
        torch_module.cuda.set_device(0)
    if chosen == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = interface_of(info.peers[info.node])
        if interface is not None and len(set(info.peers)) > 1:
            # gloo otherwise binds what the hostname resolves to: 127.0.1.1 on stock Debian
            # and Ubuntu hosts, which the other ranks cannot reach.
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    if dist.is_initialized():  # something before us made a group: it is left as it is
        yield
        return
    groups = Groups(info, backend=chosen, init=init, init_timeout=init_timeout)
    # torch.distributed re-exports distributed_c10d's functions: both names, so that
    # ``dist.init_process_group`` and ``from torch.distributed import ...`` reach the wrapper.
    modules = (dist, dist.distributed_c10d)
    ours: dict[str, Callable[..., Any]] = {
        "init_process_group": groups.init_process_group,
        "destroy_process_group": groups.destroy_process_group,
    }
    theirs: dict[str, Callable[..., Any]] = {
        "init_process_group": groups.real_init,
        "destroy_process_group": groups.real_destroy,
    }
    _replace(modules, ours)
    _current = groups
    try:
        if init != "program":
            groups.make_pool_group()
        yield
    finally:
        _current = None
        _replace(modules, theirs)
        groups.close()


def _replace(modules: tuple[object, ...], functions: dict[str, Callable[..., Any]]) -> None:
    for module in modules:
        for name, fn in functions.items():
            setattr(module, name, fn)


def each_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The plugin's ``decorate``: when ``fn`` returns (a generator: when it is exhausted or
    closed), the worker's groups are as a new call expects them."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def generator(*args: Any, **kwargs: Any) -> Iterator[Any]:
            try:
                yield from fn(*args, **kwargs)
            finally:
                _call_ended()

        return generator

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            _call_ended()

    return call


def _call_ended() -> None:
    if _current is not None:
        _current.call_ended()


def interface_of(address: str) -> str | None:
    """The name of this host's network interface that holds ``address`` (IPv4), if any."""
    try:
        wanted = ipaddress.ip_address(socket.gethostbyname(address))
    except (OSError, ValueError):
        return None
    if wanted.version != 4:
        return None
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(probe.fileno(), siocgifaddr, request)
            except OSError:
                continue  # no IPv4 address on this interface
            if ipaddress.ip_address(socket.inet_ntoa(answer[20:24])) == wanted:
                return name
    return None
