"""``sky.plugins.joblib()`` and ``sky.plugins.sklearn()``: joblib's parallel loops, and so
scikit-learn's ``n_jobs``, spread over a pool.

::

    with sky.ComputePool(nodes=4, plugins=[sky.plugins.sklearn()]) as pool:
        GridSearchCV(model, grid, n_jobs=-1).fit(X, y)   # the fits run on the pool's workers

On the client (``around_client``): from the moment the pool runs until it closes, the pool is
joblib's default backend in the thread that started it, as ``joblib.parallel_config`` would
make it; ``sky.plugins.joblib.backend(pool)`` does the same for any block, in any thread,
with or without the plugins. The loop itself runs on the client, where scikit-learn calls it;
each batch of tasks joblib makes is one ``pool.submit`` (the batch pickled with cloudpickle,
as any call), and its result comes back through the future's callback, as joblib's own
process backend does. ``n_jobs=-1`` (and joblib's unset ``n_jobs``, as under any
``parallel_config``) means every slot of the pool (workers x concurrency). Nested loops
inside a task run sequentially on its worker.

On the workers (``transform``): ``joblib``, and ``scikit-learn`` for ``sklearn()``, so that
they can unpickle the batches; ``version=`` pins the package.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skyward._image import Image
from skyward._plugin import Plugin
from skyward.client.options import check_version, keyword_signature, pinned, validated

if TYPE_CHECKING:
    from skyward.pool import ComputePool
    from skyward.pool.spec import PoolSpec

# The plugins that make the pool joblib's default: with both in one pool only the first does.
_BACKEND_PLUGINS = ("joblib", "sklearn")


class JoblibOptions(TypedDict, total=False):
    """``sky.plugins.joblib()``'s keyword options; the defaults and limits are
    ``_JoblibOptions``'s."""

    version: str | None


class _JoblibOptions(BaseModel):
    """The plugin's options, checked when it is made: a wrong value is a ``ValidationError``
    naming the option, before any pool exists. The only home of their defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, title="sky.plugins.joblib")

    version: str | None = Field(default=None, min_length=1)

    _version = field_validator("version")(check_version)


class SklearnOptions(TypedDict, total=False):
    """``sky.plugins.sklearn()``'s keyword options; the defaults and limits are
    ``_SklearnOptions``'s."""

    version: str | None


class _SklearnOptions(BaseModel):
    """As ``_JoblibOptions``, for scikit-learn."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, title="sky.plugins.sklearn")

    version: str | None = Field(default=None, min_length=1)

    _version = field_validator("version")(check_version)


class _Joblib:
    """``sky.plugins.joblib()`` makes the plugin; ``sky.plugins.joblib.backend(pool)`` is the
    context in which joblib's loops run on ``pool``."""

    def __call__(self, **options: Unpack[JoblibOptions]) -> Plugin:
        """joblib on every worker, and the pool as joblib's default backend while it runs.

        - ``version``: pin joblib (``"1.4.2"``) or constrain it (``">=1.3"``); default, the
          newest the index has.
        """
        chosen = validated(_JoblibOptions, options, JoblibOptions, "joblib")
        requirement = pinned("joblib", chosen.version)

        def transform(image: Image, spec: PoolSpec) -> Image:
            return image.with_pip(requirement)

        return Plugin(name="joblib", transform=transform, around_client=_default_backend("joblib"))

    @contextmanager
    def backend(self, pool: ComputePool, *, n_jobs: int | None = None) -> Iterator[None]:
        """joblib's ``Parallel`` (and scikit-learn's ``n_jobs``) runs on ``pool`` in the
        block. ``n_jobs``: the default number of tasks in flight (default: every slot)."""
        import joblib as joblib_module

        backend = _backend_class()(pool)
        with joblib_module.parallel_config(backend=backend, n_jobs=n_jobs or -1):
            yield


joblib = _Joblib()
# help() and notebooks show the option with its default (a class attribute: inspect reads
# __signature__ off the instance).
_Joblib.__signature__ = keyword_signature(  # type: ignore[attr-defined]
    JoblibOptions, _JoblibOptions, returns=Plugin
)


def sklearn(**options: Unpack[SklearnOptions]) -> Plugin:
    """scikit-learn and joblib on every worker, and the pool as joblib's default backend
    while it runs, so estimators' ``n_jobs`` (grid searches, forests) run on the pool.

    - ``version``: pin scikit-learn (``"1.5.2"``) or constrain it (``">=1.4,<2"``); default,
      the newest the index has. joblib comes in whatever version scikit-learn needs.
    """
    chosen = validated(_SklearnOptions, options, SklearnOptions, "sklearn")
    requirement = pinned("scikit-learn", chosen.version)

    def transform(image: Image, spec: PoolSpec) -> Image:
        return image.with_pip(requirement, "joblib")

    return Plugin(name="sklearn", transform=transform, around_client=_default_backend("sklearn"))


sklearn.__signature__ = keyword_signature(  # type: ignore[attr-defined]
    SklearnOptions, _SklearnOptions, returns=Plugin
)


def _default_backend(name: str) -> Any:
    """The ``around_client`` hook of plugin ``name``: the pool as joblib's default backend,
    unless another of the backend plugins comes before it in the same pool."""

    def around_client(pool: ComputePool, spec: PoolSpec) -> AbstractContextManager[None]:
        first = next(p.name for p in spec.plugins if p.name in _BACKEND_PLUGINS)
        return as_default(pool) if first == name else nullcontext()

    return around_client


@contextmanager
def as_default(pool: ComputePool) -> Iterator[None]:
    """``pool`` as joblib's default backend in this thread until the block ends, wherever it
    ends.

    joblib keeps its default per thread (``parallel_config`` sets a thread-local dict). A
    pool is usually closed in the thread that started it, and then this is
    ``parallel_config``'s own exit. When it is closed from another thread (a notebook's
    watcher, a signal), that thread cannot reach the first one's thread-local, so the dict
    installed there is given back the settings it replaced, in place: the starting thread's
    joblib is then back to what it was before the pool either way.
    """
    import joblib as joblib_module
    from joblib import parallel as joblib_parallel

    config = joblib_module.parallel_config(backend=_backend_class()(pool), n_jobs=-1)
    installed: dict[str, Any] = config.parallel_config
    previous = dict(config.old_parallel_config)
    starter = threading.get_ident()
    try:
        yield
    finally:
        here = threading.get_ident() == starter
        if here and getattr(joblib_parallel._backend, "config", None) is installed:
            config.unregister()
        else:
            # Another thread, or a parallel_config entered inside ours and never left: the
            # dict that thread holds (and the one its inner config will restore) reverts.
            installed.clear()
            installed.update(previous)


def _run_batch(batch: Any) -> Any:
    """On a worker: one batch of joblib tasks (a ``BatchedCalls``), its results as a list."""
    return batch()


def _portable(batch: Any) -> Any:
    """``batch`` with the warning filters scikit-learn packs into each task made safe to
    unpickle on a worker that lacks some of the client's packages.

    scikit-learn's ``Parallel`` hands every task the client's ``warnings.filters``, so that
    the task warns as the caller would. A filter's category is a class, pickled by reference:
    one from a package only the client has (pytest's own, a notebook extension's) would make
    the whole batch fail to unpickle there with ``ModuleNotFoundError``. Each such list
    travels as ``_Filters`` instead, which drops on arrival the filters whose category the
    worker cannot import (no code there can raise those). The list itself is the client's
    live ``warnings.filters``: it is replaced on the task, never changed.
    """
    for item in getattr(batch, "items", ()):
        task = item[0]
        filters = getattr(task, "warning_filters", None)
        if isinstance(filters, list):
            task.warning_filters = _Filters(filters)
    return batch


class _Filters(list[Any]):
    """Warning filters that unpickle as a plain list of those the receiver can import."""

    def __reduce__(self) -> tuple[Any, ...]:
        named = [
            (action, message, (category.__module__, category.__qualname__), module, lineno)
            for action, message, category, module, lineno in self
        ]
        return (_importable_filters, (named,))


def _importable_filters(named: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """On a worker: the filters whose category class this process can import."""
    import importlib

    filters = []
    for action, message, (module_name, qualname), module, lineno in named:
        try:
            category: Any = importlib.import_module(module_name)
            for part in qualname.split("."):
                category = getattr(category, part)
        except (ImportError, AttributeError):
            continue
        filters.append((action, message, category, module, lineno))
    return filters


def _backend_class() -> type[Any]:
    """The backend class, made on first use so that ``import skyward`` never imports joblib."""
    global _BACKEND
    if _BACKEND is not None:
        return _BACKEND
    from joblib.parallel import ParallelBackendBase, SequentialBackend

    class SkywardBackend(ParallelBackendBase):  # type: ignore[misc]
        """joblib's backend interface over a pool's ``submit``."""

        supports_retrieve_callback = True
        supports_timeout = True
        default_n_jobs = -1

        def __init__(self, pool: ComputePool, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.pool = pool
            self._futures: set[Future[Any]] = set()

        def effective_n_jobs(self, n_jobs: int | None) -> int:
            if n_jobs == 0:
                raise ValueError("n_jobs == 0 in Parallel has no meaning")
            slots = _slots(self.pool)
            if n_jobs is None or n_jobs < 0:
                return max(1, slots + 1 + (n_jobs or -1))
            return n_jobs

        def submit(self, func: Any, callback: Any = None) -> Future[Any]:
            future = self.pool.submit(_run_batch, _portable(func))
            self._futures.add(future)
            future.add_done_callback(self._futures.discard)
            if callback is not None:
                future.add_done_callback(callback)
            return future

        def retrieve_result_callback(self, out: Future[Any]) -> Any:
            return out.result()

        def retrieve_result(self, out: Future[Any], timeout: float | None = None) -> Any:
            return out.result(timeout=timeout)

        def abort_everything(self, ensure_ready: bool = True) -> None:
            for future in list(self._futures):
                future.cancel()  # queued ones never run; running ones finish and are dropped

        def get_nested_backend(self) -> tuple[Any, int | None]:
            nesting = (self.nesting_level or 0) + 1
            return SequentialBackend(nesting_level=nesting), None

    _BACKEND = SkywardBackend
    return SkywardBackend


_BACKEND: type[Any] | None = None


def _slots(pool: ComputePool) -> int:
    """Calls the pool runs at once: every ready worker's ``concurrency``."""
    return max(1, pool.statistics().ready_workers * pool.spec.concurrency)
