"""``sky.plugins.torch()``: PyTorch from its own index on every node, and one
``torch.distributed`` process group across them.

On the client (``transform``): adds ``torch`` (and ``torchvision`` / ``torchaudio`` when
asked) from PyTorch's index for the pool's hardware: CUDA wheels for NVIDIA GPUs, CPU wheels
otherwise. The index is scoped to those packages, as the jax plugin scopes jax's, so it never
shadows anything else the image installs.

On every worker (``around_app``, ``decorate``: ``skyward.plugins._torchrun``): every variable
torchrun sets (``MASTER_ADDR`` = node 0's pool address, ``MASTER_PORT`` = the port node 0
found free when it said Hello, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK``,
``TORCHELASTIC_*``, ...), one rank per worker (so one per GPU with ``workers_per_node="gpus"``,
as torchrun's ``nproc_per_node``), and the process groups: the pool's, made before the first
call (``init``: ``"auto"``, ``"plugin"``), and the ones programs make themselves with their
own ``init_process_group``, call after call. The coordinator port is node 0's one verified
port, which the jax plugin also takes, so the two cannot share a pool.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal, TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field

from skyward._errors import PluginError
from skyward._image import Image, PipIndex
from skyward._info import InstanceInfo
from skyward._plugin import Plugin
from skyward.client.options import keyword_signature, leading, refuse_unknown
from skyward.plugins._torchrun import Init, each_call, launched

if TYPE_CHECKING:
    from skyward.pool.spec import PoolSpec

Backend = Literal["gloo", "nccl", "mpi"]
INDEX = "https://download.pytorch.org/whl"
DEFAULT_CUDA = "cu126"  # wheels for CUDA 12.6 run on every driver from 525 on
PACKAGES = ("torch", "torchvision", "torchaudio")
_DAY = 24 * 3600


class TorchOptions(TypedDict, total=False):
    """``sky.plugins.torch()``'s keyword options as a caller gives them (``backend`` comes
    first, and may be positional); the defaults and limits are ``_Options``'s, and
    ``torch()``'s docstring says what each does."""

    cuda: str | int | None
    version: str | None
    vision: bool
    audio: bool
    index_url: str | None
    init: Init
    init_timeout: int


class _Options(BaseModel):
    """The plugin's options, checked when it is made: a wrong type or range is a
    ``ValidationError`` naming the option, before any pool exists. The only home of their
    defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, title="sky.plugins.torch")

    backend: Backend | None = None
    cuda: str | int | None = None
    version: str | None = Field(default=None, min_length=1)
    vision: bool = False
    audio: bool = False
    index_url: str | None = Field(default=None, min_length=1)
    init: Init = "auto"
    init_timeout: int = Field(default=60, ge=1, le=_DAY)


def torch(backend: Backend | None = None, **options: Unpack[TorchOptions]) -> Plugin:
    """The PyTorch plugin.

    - ``backend``: ``torch.distributed`` backend; default ``nccl`` on NVIDIA pools, ``gloo``
      otherwise.
    - ``cuda``: the CUDA build of the wheels on NVIDIA pools (``"cu124"``, ``"12.4"``, ``12``
      for the default minor); default ``cu126``.
    - ``version``: pin torch (``"2.6.0"``) or constrain it (``">=2.4"``).
    - ``vision``, ``audio``: also install ``torchvision`` / ``torchaudio`` from the same index.
    - ``index_url``: PyTorch's index, or your mirror of it (the ``cpu`` or ``cuXYZ`` path is
      added); used for torch's own packages only.
    - ``init``: who makes the ``torch.distributed`` group. ``"auto"``: the pool's group is
      there before every call, and a program's own ``init_process_group`` (a torchrun
      script's) gets it, or, asking for another backend, its own for that call;
      ``destroy_process_group`` leaves the pool's group to the next call. ``"plugin"``: the
      pool's group only (another backend is a ``PluginError``). ``"program"``: as under
      torchrun, no group until the program makes one, and each call is a launch: a group
      it leaves is destroyed when it returns.
    - ``init_timeout``: seconds a group's rendezvous may take before it fails (a rank that
      never arrives).

    One rank per worker: with ``workers_per_node`` (``"gpus"``: one per GPU, as torchrun's
    ``nproc_per_node``) each worker is its own rank and sees only its own GPUs.
    """
    refuse_unknown(options, TorchOptions, "torch")
    chosen = _Options.model_validate({"backend": backend, **options})  # only what was given
    # The hooks below travel to every worker: they close over plain values, not the model.
    cuda, version, index_url = chosen.cuda, chosen.version, chosen.index_url
    vision, audio, init_timeout = chosen.vision, chosen.audio, chosen.init_timeout
    init = chosen.init
    build = cuda_build(cuda) if cuda is not None else DEFAULT_CUDA

    def transform(image: Image, spec: PoolSpec) -> Image:
        names = [plugin.name for plugin in spec.plugins]
        if "jax" in names:
            raise PluginError(
                "torch plugin: a pool runs one distributed runtime, and jax's takes node 0's "
                "coordinator port too; use plugins=[sky.plugins.torch()] or "
                "[sky.plugins.jax()], not both"
            )
        gpu = spec.accelerator is not None
        if backend == "nccl" and not gpu:
            raise PluginError(
                "torch plugin: backend='nccl' needs NVIDIA GPUs; this pool has no accelerator "
                "(use backend='gloo', or leave it unset)"
            )
        wanted = ["torch", *(["torchvision"] if vision else []), *(["torchaudio"] if audio else [])]
        pin = _pin(version)
        url = f"{(index_url or INDEX).rstrip('/')}/{build if gpu else 'cpu'}"
        requirements = [f"torch{pin}", *wanted[1:]]
        return image.with_pip(*requirements, indexes=(PipIndex(url=url, packages=tuple(wanted)),))

    @contextmanager
    def around_app(info: InstanceInfo) -> Iterator[None]:
        with launched(info, backend=backend, init=init, init_timeout=init_timeout):
            yield

    return Plugin(
        name="torch", transform=transform, around_app=around_app, decorate=each_call, gang=True
    )


# help() and notebooks show every option with _Options' default.
torch.__signature__ = keyword_signature(  # type: ignore[attr-defined]
    TorchOptions,
    _Options,
    before=[leading("backend", _Options)],
    returns=Plugin,
)


def cuda_build(cuda: str | int) -> str:
    """PyTorch's wheel tag for a CUDA version: ``12`` -> ``cu126``, ``"12.4"`` / ``"cu124"``
    -> ``cu124``."""
    text = str(cuda).strip().lower()
    match = re.fullmatch(r"(?:cu|cuda)?(\d{2})(?:\.?(\d))?", text)
    if not match:
        raise PluginError(
            f"torch plugin: cuda={cuda!r} is not a CUDA version; write it as 12, '12.4' or "
            f"'cu124' (PyTorch's wheel tags)"
        )
    major, minor = match.group(1), match.group(2)
    if minor is None:
        return DEFAULT_CUDA if major == DEFAULT_CUDA[2:4] else f"cu{major}0"
    return f"cu{major}{minor}"


def _pin(version: str | None) -> str:
    if not version:
        return ""
    return version if version.lstrip()[:1] in "<>=!~" else f"=={version}"
