"""``InstanceInfo``: what a worker knows about its place in the pool.

The client builds one per node after every worker has said ``Hello`` and sends it in
``Start``; the worker keeps it for ``instance_info()``. Outside a worker (the client, or a
function run with ``f.local()``) ``instance_info()`` describes the current process as the only
node of a one-node pool, so code that shards by ``node``/``total_nodes`` runs unchanged.
"""

from __future__ import annotations

import socket

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator


class InstanceInfo(BaseModel):
    """A node's identity in its pool. Frozen; identical fields on every node but ``node``.

    - ``node``: this node's rank, ``0 .. total_nodes - 1``.
    - ``head_addr`` / ``head_port``: where node 0 can be reached by the other nodes, and a
      port node 0 found free at start (the jax plugin puts its coordinator there).
    - ``peers``: every node's address, by rank (``peers[0] == head_addr``).
    - ``accelerators``: accelerator devices on this node (0 on CPU-only nodes);
      ``accelerator``: their kind, as the pool asked for it (``"A100"``), or ``None``.
    - ``total_accelerators``: accelerator devices on every node together.
    - ``pool``, ``provider``: the pool's name and the provider's kind (``"local"``);
      ``job_id``: this pool's run, unique (a restarted worker keeps it).
    - ``worker`` / ``workers_per_node``: skyward 0.5's workers within a node (a node's GPU
      split by MIG); here always ``0`` / ``1``, since each node runs one worker process
      (``concurrency`` threads or processes inside it).
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

    @computed_field  # type: ignore[prop-decorator]
    @property
    def is_head(self) -> bool:
        return self.node == 0

    @property
    def global_worker_index(self) -> int:
        """This worker's index over the whole pool (skyward 0.5); here equal to ``node``."""
        return self.node * self.workers_per_node + self.worker

    @property
    def total_workers(self) -> int:
        return self.total_nodes * self.workers_per_node

    @model_validator(mode="after")
    def _consistent(self) -> InstanceInfo:
        if self.total_accelerators == -1:  # not given: every node like this one
            object.__setattr__(self, "total_accelerators", self.accelerators * self.total_nodes)
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
