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

import socket

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator


class InstanceInfo(BaseModel):
    """A worker's identity in its pool. Frozen; identical on every worker but ``node``,
    ``worker``, ``devices``, ``accelerators`` and ``hostname``.

    - ``node``: this node's rank, ``0 .. total_nodes - 1``.
    - ``head_addr`` / ``head_port``: where node 0 can be reached by the other nodes, and a
      port node 0 found free at start (the jax plugin puts its coordinator there).
    - ``peers``: every node's address, by rank (``peers[0] == head_addr``).
    - ``accelerators``: accelerator devices on this node (0 on CPU-only nodes);
      ``accelerator``: their kind, as the pool asked for it (``"A100"``), or ``None``.
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
    """

    # defer_build: a worker only unpickles these and never validates one, so it need not
    # pay for building the validator when it imports the module (about a tenth of a second
    # of every worker's start, with Image and Plugin); the client builds it on first use.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    node: int = Field(ge=0)
    total_nodes: int = Field(ge=1)
    head_addr: str
    head_port: int = Field(ge=0, le=65535)
    peers: tuple[str, ...]
    accelerators: int = Field(default=0, ge=0)
    total_accelerators: int = Field(default=-1, ge=-1)  # -1: accelerators x total_nodes
    accelerator: str | None = None
    pool: str | None = None
    job_id: str = ""
    provider: str = "local"
    hostname: str
    worker: int = Field(default=0, ge=0)
    workers_per_node: int = Field(default=1, ge=1)
    devices: tuple[int, ...] = ()

    @computed_field  # type: ignore[prop-decorator]
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

    @model_validator(mode="after")
    def _consistent(self) -> InstanceInfo:
        if self.total_accelerators == -1:  # not given: every node like this one
            object.__setattr__(self, "total_accelerators", self.accelerators * self.total_nodes)
        if self.worker >= self.workers_per_node:
            raise ValueError(
                f"worker {self.worker} is out of range for {self.workers_per_node} per node"
            )
        if self.node >= self.total_nodes:
            raise ValueError(f"node {self.node} is out of range for {self.total_nodes} nodes")
        if len(self.peers) != self.total_nodes:
            raise ValueError(f"peers has {len(self.peers)} entries for {self.total_nodes} nodes")
        return self


_current: InstanceInfo | None = None


def instance_info() -> InstanceInfo:
    """This node's ``InstanceInfo``.

    On a worker, the info the client sent at start. Anywhere else, a one-node description of
    the current process (node 0 of 1, loopback head, ``pool=None``).
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
