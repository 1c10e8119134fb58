"""``sky.plugins.joblib()`` and ``sky.plugins.sklearn()``: joblib's parallel loops, and so
scikit-learn's ``n_jobs``, spread over a pool.

::

    with sky.ComputePool(nodes=4, plugins=[sky.plugins.sklearn()]) as pool:
        with sky.plugins.joblib.backend(pool):
            GridSearchCV(model, grid, n_jobs=-1).fit(X, y)   # fits run on the pool's nodes

The loop itself runs on the client, where scikit-learn calls it; each batch of tasks joblib
makes is one ``pool.submit`` (the batch pickled with cloudpickle, as any call), and its result
comes back through the future's callback, as joblib's own process backend does. ``n_jobs=-1``
means every slot of the pool (nodes x concurrency). Nested loops inside a task run
sequentially on its node.

The plugins only install the packages (``joblib``; ``scikit-learn`` and ``joblib`` for
``sklearn()``) on the workers; the backend is what sends the work.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from skyward._image import Image
from skyward._plugin import Plugin

if TYPE_CHECKING:
    from skyward.pool import ComputePool
    from skyward.pool.spec import PoolSpec


class _Joblib:
    """``sky.plugins.joblib()`` makes the plugin; ``sky.plugins.joblib.backend(pool)`` is the
    context in which joblib's loops run on ``pool``."""

    def __call__(self) -> Plugin:
        def transform(image: Image, spec: PoolSpec) -> Image:
            return image.with_pip("joblib")

        return Plugin(name="joblib", transform=transform)

    @contextmanager
    def backend(self, pool: ComputePool, *, n_jobs: int | None = None) -> Iterator[None]:
        """joblib's ``Parallel`` (and scikit-learn's ``n_jobs``) runs on ``pool`` in the
        block. ``n_jobs``: the default number of tasks in flight (default: every slot)."""
        import joblib as joblib_module

        backend = _backend_class()(pool)
        with joblib_module.parallel_config(backend=backend, n_jobs=n_jobs or -1):
            yield


joblib = _Joblib()


def sklearn() -> Plugin:
    """scikit-learn and joblib on every worker; run its estimators' ``n_jobs`` on the pool
    with ``sky.plugins.joblib.backend(pool)``."""

    def transform(image: Image, spec: PoolSpec) -> Image:
        return image.with_pip("scikit-learn", "joblib")

    return Plugin(name="sklearn", transform=transform)


def _run_batch(batch: Any) -> Any:
    """On a worker: one batch of joblib tasks (a ``BatchedCalls``), its results as a list."""
    return batch()


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
            future = self.pool.submit(_run_batch, func)
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
    stats = pool.statistics()
    return max(1, stats.ready_nodes * pool.spec.concurrency)
