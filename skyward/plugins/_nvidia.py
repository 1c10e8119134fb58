"""Plugins that only make sense on NVIDIA GPUs: ``sky.plugins.cuml()`` (RAPIDS cuML, with its
zero-code-change accelerator) and ``sky.plugins.mps()`` (NVIDIA's Multi-Process Service, so
several processes share a GPU).

Both refuse a pool without an accelerator when it is built: there is nothing for them to do
there, and a CPU pool that installed cuML would fail at its first import instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from skyward._errors import PluginError
from skyward._image import Image, PipIndex
from skyward._info import InstanceInfo
from skyward._plugin import Plugin

if TYPE_CHECKING:
    from skyward.pool.spec import PoolSpec

NVIDIA_INDEX = "https://pypi.nvidia.com"
# What ``cuml-cuXX`` pulls from NVIDIA's index: scoping the index to these keeps it from
# answering for anything else the image installs.
_RAPIDS = ("cuml", "cudf", "pylibraft", "raft-dask", "rmm", "dask-cudf", "libcuml", "libcudf")
_MPS_CONTROL = "nvidia-cuda-mps-control"


def _needs_gpu(plugin: str, spec: PoolSpec) -> None:
    if spec.accelerator is None:
        raise PluginError(
            f"{plugin} plugin: needs NVIDIA GPUs, and this pool has no accelerator; give the "
            f"pool one (accelerator='L4', 'A100', ...) or leave the plugin out"
        )


class _CumlOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, title="sky.plugins.cuml")

    cuda: str | int = 12
    version: str | None = Field(default=None, min_length=1)
    accelerate: bool = True


def cuml(cuda: str | int = 12, *, version: str | None = None, accelerate: bool = True) -> Plugin:
    """RAPIDS cuML from NVIDIA's index.

    - ``cuda``: the CUDA major of the wheels (``12`` or ``13``; ``"cu12"`` works too).
    - ``version``: pin cuML (``"25.10"``) or constrain it.
    - ``accelerate``: turn on ``cuml.accel`` on every worker, so scikit-learn, UMAP and
      HDBSCAN code runs on the GPU unchanged.
    """
    _CumlOptions(cuda=cuda, version=version, accelerate=accelerate)
    match = re.fullmatch(r"(?:cu|cuda)?(\d{2})(?:\.\d)?", str(cuda).strip().lower())
    if not match or match.group(1) not in ("12", "13"):
        raise PluginError(f"cuml plugin: cuda={cuda!r}: RAPIDS publishes wheels for CUDA 12 and 13")
    suffix = f"cu{match.group(1)}"
    pin = "" if not version else version if version[:1] in "<>=!~" else f"=={version}"

    def transform(image: Image, spec: PoolSpec) -> Image:
        _needs_gpu("cuml", spec)
        packages = tuple(f"{name}-{suffix}" for name in _RAPIDS)
        index = PipIndex(url=NVIDIA_INDEX, packages=packages)
        return image.with_pip(f"cuml-{suffix}{pin}", indexes=(index,))

    @contextmanager
    def around_app(info: InstanceInfo) -> Iterator[None]:
        if accelerate:
            import cuml.accel  # type: ignore[import-not-found]

            cuml.accel.install()
        yield

    return Plugin(name="cuml", transform=transform, around_app=around_app)


class _MpsOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, title="sky.plugins.mps")

    active_thread_percentage: int | None = Field(default=None, ge=1, le=100)
    pinned_memory_limit: str | None = Field(default=None, pattern=r"^\d+[MG]$")


def mps(
    *, active_thread_percentage: int | None = None, pinned_memory_limit: str | None = None
) -> Plugin:
    """NVIDIA's Multi-Process Service on every GPU node, for the life of the pool.

    - ``active_thread_percentage``: the share of each GPU's SMs a client may use
      (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``).
    - ``pinned_memory_limit``: device memory each client may pin, such as ``"16G"``
      (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, applied to every device).

    The control daemon is started (``nvidia-cuda-mps-control -d``) with its pipe and log
    directories private to the pool, before the worker's code runs, and told to ``quit``
    when the worker leaves.
    """
    _MpsOptions(
        active_thread_percentage=active_thread_percentage, pinned_memory_limit=pinned_memory_limit
    )

    def transform(image: Image, spec: PoolSpec) -> Image:
        _needs_gpu("mps", spec)
        return image

    @contextmanager
    def around_app(info: InstanceInfo) -> Iterator[None]:
        base = tempfile.mkdtemp(prefix="skyward-mps-")
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": os.path.join(base, "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": os.path.join(base, "log"),
        }
        if active_thread_percentage is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(active_thread_percentage)
        if pinned_memory_limit is not None:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={pinned_memory_limit}"
        for directory in (env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_LOG_DIRECTORY"]):
            os.makedirs(directory, exist_ok=True)
        daemon_env = {**os.environ, **env}
        _control(["-d"], daemon_env, info)
        os.environ.update(env)  # this worker's CUDA clients find the daemon through these
        try:
            yield
        finally:
            _control([], daemon_env, info, stdin="quit\n")

    return Plugin(name="mps", transform=transform, around_app=around_app)


def _control(args: list[str], env: dict[str, str], info: InstanceInfo, stdin: str = "") -> None:
    try:
        done = subprocess.run(
            [_MPS_CONTROL, *args],
            input=stdin,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except FileNotFoundError as exc:
        raise PluginError(
            f"mps plugin: node {info.node} has no {_MPS_CONTROL} on PATH; it comes with "
            f"NVIDIA's driver (the CUDA images and Deep Learning AMIs have it)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise PluginError(f"mps plugin: node {info.node}: {_MPS_CONTROL} did not answer") from exc
    if done.returncode != 0:
        what = "start" if args else "stop"
        raise PluginError(
            f"mps plugin: node {info.node} could not {what} the MPS control daemon "
            f"(exit {done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}"
        )
