"""``Plugin``: a name and optional hooks, composed in list order.

``transform(image, spec) -> image`` runs on the client when the pool is built, first plugin
first; it may raise ``PluginError`` (the keras plugin does when jax is missing before it).
``bootstrap``: shell steps (or ``spec -> steps``) added to every remote node's bootstrap
after the image's own installs and ``setup``, right after the plugin's ``transform``; the
local provider, whose nodes are this machine, refuses them when the pool is built.
``around_client(pool, spec) -> context manager`` runs on the client: entered once the pool
has started, first plugin first, and exited in reverse when the pool closes, before its
workers stop, on every path (a failed entry closes the pool).
``around_app(info) -> context manager`` runs on every worker: entered in list order before the
first call, exited in reverse at shutdown, like nested ``with`` blocks (first = outermost).
``decorate(fn) -> fn`` wraps the function of every call on the worker, at each call; the
first plugin's decorator is outermost, as if stacked above the others.
Hooks travel to workers with cloudpickle, so a plugin must pickle; the pool checks that when
it is built.

skyward 0.5 built plugins with ``Plugin.create(name).with_image_transform(...)
.with_decorator(...).with_around_app(...)``; those builders are here too, with
``with_bootstrap`` and ``with_around_client``. Only the worker's hooks travel to workers:
``bootstrap`` and ``around_client`` stay on the client (``for_workers``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from skyward._errors import PluginError
from skyward._image import Image
from skyward._info import InstanceInfo

# transform(image, spec: PoolSpec) -> Image; PoolSpec is not named here, since _spec
# imports this module.
Transform = Callable[[Image, Any], Image]
AroundApp = Callable[[InstanceInfo], AbstractContextManager[Any]]
Decorate = Callable[[Callable[..., Any]], Callable[..., Any]]
# steps, or steps(spec: PoolSpec)
Bootstrap = Sequence[str] | Callable[[Any], Sequence[str]]
# around_client(pool: ComputePool, spec: PoolSpec)
AroundClient = Callable[[Any, Any], AbstractContextManager[Any]]


class Plugin(BaseModel):
    """A named bundle of hooks. See the module docstring for when each hook runs."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", arbitrary_types_allowed=True, defer_build=True
    )

    name: str = Field(min_length=1)
    transform: Callable[..., Image] | None = None
    around_app: Callable[..., AbstractContextManager[Any]] | None = None
    decorate: Callable[..., Callable[..., Any]] | None = None
    bootstrap: tuple[str, ...] | Callable[..., Sequence[str]] | None = None
    around_client: Callable[..., AbstractContextManager[Any]] | None = None
    # True when around_app ties every node into one runtime that cannot take a new member
    # (jax.distributed): when one worker is lost, the pool restarts all of them together.
    gang: bool = False

    @classmethod
    def create(cls, name: str) -> Plugin:
        """A plugin with no hooks yet; add them with the ``with_*`` methods."""
        return cls(name=name)

    def with_image_transform(self, transform: Transform) -> Plugin:
        return self.model_copy(update={"transform": transform})

    def with_decorator(self, decorate: Decorate) -> Plugin:
        return self.model_copy(update={"decorate": decorate})

    def with_around_app(self, around_app: AroundApp) -> Plugin:
        return self.model_copy(update={"around_app": around_app})

    def with_bootstrap(self, steps: Bootstrap) -> Plugin:
        """Shell steps for every remote node's bootstrap: a list of commands, or a function
        of the pool's spec that returns one (skyward 0.5 passed the cluster)."""
        if isinstance(steps, str):
            raise PluginError(
                f"plugin {self.name!r}: with_bootstrap takes a list of shell commands, not one "
                f"string: with_bootstrap([{steps!r}])"
            )
        return self.model_validate({**dict(self), "bootstrap": steps})

    def with_around_client(self, around_client: AroundClient) -> Plugin:
        """``around_client(pool, spec)``: a context manager around the client's use of the
        running pool."""
        return self.model_copy(update={"around_client": around_client})

    def bootstrap_steps(self, spec: Any) -> tuple[str, ...]:
        """This plugin's bootstrap steps for ``spec``; ``PluginError`` for anything but a
        sequence of non-empty strings."""
        if self.bootstrap is None:
            return ()
        steps = self.bootstrap(spec) if callable(self.bootstrap) else self.bootstrap
        if isinstance(steps, str) or not all(isinstance(s, str) and s.strip() for s in steps):
            raise PluginError(
                f"plugin {self.name!r}: bootstrap must give a list of shell commands "
                f"(non-empty strings), not {steps!r}"
            )
        return tuple(steps)

    def for_workers(self) -> Plugin:
        """This plugin as workers receive it: without the client's hooks, which need not
        pickle (an ``around_client`` may hold the pool)."""
        if self.bootstrap is None and self.around_client is None:
            return self
        return self.model_copy(update={"bootstrap": None, "around_client": None})


def decorated(fn: Callable[..., Any], plugins: Sequence[Plugin]) -> Callable[..., Any]:
    """``fn`` wrapped by every plugin's ``decorate``, the first plugin's outermost."""
    for plugin in reversed(plugins):
        if plugin.decorate is not None:
            fn = plugin.decorate(fn)
    return fn


def enter_around_app(stack: ExitStack, plugins: Sequence[Plugin], info: InstanceInfo) -> None:
    """Enter each plugin's context on ``stack``, first plugin outermost."""
    for plugin in plugins:
        if plugin.around_app is None:
            continue
        context = plugin.around_app(info)
        if not hasattr(context, "__enter__"):
            raise PluginError(
                f"plugin {plugin.name!r}: around_app must return a context manager, "
                f"not {type(context).__name__}"
            )
        stack.enter_context(context)
