"""``sky.plugins.huggingface()``: Hugging Face's libraries on every node, the client's token
with them, and a model cache that outlives the pool.

The token (the argument, else the client's ``HF_TOKEN``, else the file ``huggingface-cli
login`` wrote) travels inside the plugin itself: pickled with the plugin's hooks and sent to
each worker over the pool's own link (a pipe, or the SSH channel), then set in the worker's
environment by ``around_app``. It is never part of the image, so it appears in no command
line, no bootstrap script and no log. ``HF_HOME`` points at ``<cache>`` on each host
(default ``~/.cache/skyward/huggingface``, beside Skyward's environments), so weights a pool
downloaded are there for the next pool on the same host.

On a pool without accelerators, ``around_app`` also sets ``ACCELERATE_USE_CPU=True``, as
``accelerate launch --cpu`` does: without it accelerate goes distributed only on GPUs, and its
programs would run as lone processes beside each other (the torch plugin's ranks unused).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field

from skyward._image import Image
from skyward._info import InstanceInfo
from skyward._plugin import Plugin
from skyward.client.options import keyword_signature, leading, validated

if TYPE_CHECKING:
    from skyward.pool.spec import PoolSpec

DEFAULT_CACHE = "~/.cache/skyward/huggingface"


class HuggingfaceOptions(TypedDict, total=False):
    """``sky.plugins.huggingface()``'s keyword options (``token`` comes first, and may be
    positional); the defaults and limits are ``_Options``'s."""

    cache: str | None
    transformers: bool
    datasets: bool
    accelerate: bool


class _Options(BaseModel):
    """The plugin's options, checked when it is made: a wrong value is a ``ValidationError``
    naming the option, before any pool exists. The only home of their defaults."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, title="sky.plugins.huggingface"
    )

    token: str | None = Field(default=None, min_length=1, repr=False)
    cache: str | None = Field(default=None, min_length=1)
    transformers: bool = True
    datasets: bool = False
    accelerate: bool = False


def huggingface(token: str | None = None, **options: Unpack[HuggingfaceOptions]) -> Plugin:
    """The Hugging Face plugin.

    - ``token``: an access token for gated models and private repositories; default, the
      client's ``HF_TOKEN`` or the token ``huggingface-cli login`` saved. Never written to
      the image, a command line or a log.
    - ``cache``: ``HF_HOME`` on the nodes (``~`` is each node's home); default
      ``~/.cache/skyward/huggingface``.
    - ``transformers``, ``datasets``, ``accelerate``: which libraries to install.
    """
    chosen = validated(_Options, options, HuggingfaceOptions, "huggingface", token=token)
    cache, transformers = chosen.cache, chosen.transformers
    datasets, accelerate = chosen.datasets, chosen.accelerate
    secret = token or client_token()
    home = cache or DEFAULT_CACHE
    packages = [
        name
        for name, wanted in (
            ("transformers", transformers),
            ("datasets", datasets),
            ("accelerate", accelerate),
        )
        if wanted
    ]

    def transform(image: Image, spec: PoolSpec) -> Image:
        return image.with_pip(*packages) if packages else image

    @contextmanager
    def around_app(info: InstanceInfo) -> Iterator[None]:
        previous = {k: os.environ.get(k) for k in ("HF_TOKEN", "HF_HOME", "ACCELERATE_USE_CPU")}
        os.environ.setdefault("HF_HOME", os.path.expanduser(home))
        if secret:
            os.environ["HF_TOKEN"] = secret
        if not info.accelerators:
            # accelerate launch --cpu's variable; an image's own value wins
            os.environ.setdefault("ACCELERATE_USE_CPU", "True")
        try:
            yield
        finally:
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    return Plugin(name="huggingface", transform=transform, around_app=around_app)


huggingface.__signature__ = keyword_signature(  # type: ignore[attr-defined]
    HuggingfaceOptions, _Options, before=[leading("token", _Options)], returns=Plugin
)


def client_token() -> str | None:
    """The token this machine already has: ``HF_TOKEN``, else the file the Hugging Face CLI
    saves at login (``$HF_TOKEN_PATH``, or ``token`` under ``$HF_HOME``)."""
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    path = Path(os.environ.get("HF_TOKEN_PATH") or os.path.join(home, "token"))
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None
