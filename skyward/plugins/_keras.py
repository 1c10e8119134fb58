"""``sky.plugins.keras()``: Keras 3 on every node, data-parallel across the pool's devices.

On the client: adds ``keras`` and sets ``KERAS_BACKEND`` in the workers' environment, so it is
in place before anything imports keras. With the jax backend on several nodes it needs the
jax plugin *before* it in the list: jax's distributed runtime must be up before keras looks
at the devices, and the outer plugin's context is entered first.

On every worker: when the pool has more than one device in all, installs
``keras.distribution.DataParallel`` over every device of every node, with
``auto_shard_dataset=False`` so that each node feeds ``fit`` its own numpy shard (batch size
is then per node). Keras's own ``keras.distribution.initialize`` is not used: it cannot pass
timeouts to ``jax.distributed.initialize``; the jax plugin does that.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal, TypedDict, Unpack

from pydantic import BaseModel, ConfigDict

from skyward._errors import PluginError
from skyward._image import Image
from skyward._info import InstanceInfo
from skyward._plugin import Plugin
from skyward.client.options import keyword_signature, leading, validated

if TYPE_CHECKING:
    from skyward.pool.spec import PoolSpec

Backend = Literal["jax", "torch", "tensorflow", "numpy"]
_BACKENDS = ("jax", "torch", "tensorflow", "numpy")


class KerasOptions(TypedDict, total=False):
    """``sky.plugins.keras()``'s keyword options (``backend`` comes first, and may be
    positional); the defaults are ``_Options``'s."""

    data_parallel: bool


class _Options(BaseModel):
    """The plugin's options, checked when it is made: a wrong value is a ``ValidationError``
    naming the option, before any pool exists. The only home of their defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, title="sky.plugins.keras")

    backend: Backend = "jax"
    data_parallel: bool = True


def keras(backend: Backend = "jax", **options: Unpack[KerasOptions]) -> Plugin:
    """The keras plugin.

    - ``backend``: Keras 3 backend for the workers (``KERAS_BACKEND``).
    - ``data_parallel``: with the jax backend and more than one device in the pool, install a
      ``DataParallel`` distribution over all of them (each node passes its own data).
    """
    if backend not in _BACKENDS:
        raise PluginError(
            f"keras plugin: backend={backend!r} is not a Keras 3 backend; "
            f"use one of {', '.join(_BACKENDS)}"
        )
    chosen = validated(_Options, options, KerasOptions, "keras", backend=backend)
    data_parallel = chosen.data_parallel

    def transform(image: Image, spec: PoolSpec) -> Image:
        if backend == "jax":
            _check_jax_comes_first(spec)
        if backend == "torch":
            _check_torch_comes_first(spec)
        image = image.with_pip("keras")
        return image.with_env({"KERAS_BACKEND": backend})

    @contextmanager
    def around_app(info: InstanceInfo) -> Iterator[None]:
        if backend != "jax" or not data_parallel:
            yield
            return
        import jax
        import keras as keras_module

        devices = jax.devices()  # global: every device of every node
        if len(devices) < 2:
            yield
            return
        previous = keras_module.distribution.distribution()
        if jax.process_count() > 1:
            _agree_on_a_seed()
        keras_module.distribution.set_distribution(
            keras_module.distribution.DataParallel(
                devices=keras_module.distribution.list_devices(), auto_shard_dataset=False
            )
        )
        try:
            yield
        finally:
            keras_module.distribution.set_distribution(previous)

    return Plugin(name="keras", transform=transform, around_app=around_app)


keras.__signature__ = keyword_signature(  # type: ignore[attr-defined]
    KerasOptions, _Options, before=[leading("backend", _Options)], returns=Plugin
)


def _agree_on_a_seed() -> None:
    """Seed Keras identically on every node, from node 0's random seed.

    Every node builds its own copy of each replicated weight, and jax refuses copies that
    differ ("passed to device_put is not the same on each process"), so unseeded models
    could not even be built. ``keras.distribution.initialize`` does the same (its
    ``initialize_rng``) but is not used here (see the module docstring). Like it, this seeds
    Python's and NumPy's global generators too: derive per-node randomness from
    ``sky.instance_info().node``. A collective: every node runs it, in ``around_app``.
    """
    import random

    import keras
    import numpy as np
    from jax.experimental import multihost_utils

    mine = np.asarray(random.SystemRandom().randrange(1, 2**31), dtype=np.int32)
    seed = int(multihost_utils.broadcast_one_to_all(mine))
    keras.utils.set_random_seed(seed)


def _check_jax_comes_first(spec: PoolSpec) -> None:
    names = [plugin.name for plugin in spec.plugins]
    ours = names.index("keras")
    if "jax" in names[:ours] or spec.nodes == 1:
        return
    where = "after it" if "jax" in names else "missing"
    raise PluginError(
        f"keras plugin: backend='jax' on a {spec.nodes}-node pool needs the jax plugin before "
        f"it (it is {where}), so that jax.distributed is running before keras sees the "
        f"devices. Use plugins=[sky.plugins.jax(...), sky.plugins.keras(backend='jax')]."
    )


def _check_torch_comes_first(spec: PoolSpec) -> None:
    # The torch plugin installs torch from PyTorch's own index for the pool's hardware and
    # starts the process group before keras looks at the devices.
    names = [plugin.name for plugin in spec.plugins]
    if "torch" in names[: names.index("keras")] or spec.nodes == 1:
        return
    where = "after it" if "torch" in names else "missing"
    raise PluginError(
        f"keras plugin: backend='torch' on a {spec.nodes}-node pool needs the torch plugin "
        f"before it (it is {where}), so that the process group is up before keras trains. "
        f"Use plugins=[sky.plugins.torch(), sky.plugins.keras(backend='torch')]."
    )
