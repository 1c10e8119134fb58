"""joblib's loops, and scikit-learn's n_jobs, run on the pool's workers: inside a pool with
the plugin without a backend block, or in any block with ``sky.plugins.joblib.backend(pool)``."""

from __future__ import annotations

import os
import threading
import warnings
from importlib import metadata
from pathlib import Path

import joblib
import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV
from sklearn.tree import DecisionTreeClassifier
from support.pools import PoolFactory, pool_factory
from support.sshhosts import PackageIndex

import skyward as sky


def _where(i: int) -> tuple[int, int]:
    import os

    return i * i, int(os.environ.get("SKYWARD_TEST_NODE", sky.instance_info().node))


def test_a_joblib_loop_runs_on_every_node_and_keeps_its_order() -> None:
    with sky.ComputePool(nodes=2, plugins=[sky.plugins.joblib()], console="off") as pool:
        with sky.plugins.joblib.backend(pool):
            results = joblib.Parallel(n_jobs=-1, batch_size=1)(
                joblib.delayed(_where)(i) for i in range(40)
            )
    assert [value for value, _ in results] == [i * i for i in range(40)]
    assert {node for _, node in results} == {0, 1}  # tasks ran on both nodes


def _fails(i: int) -> int:
    if i == 3:
        raise ValueError(f"task {i} failed")
    return i


def test_a_failing_task_raises_its_own_error_and_the_pool_stays_usable() -> None:
    with sky.ComputePool(nodes=2, plugins=[sky.plugins.joblib()], console="off") as pool:
        with sky.plugins.joblib.backend(pool):
            with pytest.raises(ValueError, match="task 3 failed"):
                joblib.Parallel(n_jobs=-1)(joblib.delayed(_fails)(i) for i in range(10))
            assert joblib.Parallel()(joblib.delayed(_fails)(i) for i in range(3)) == [0, 1, 2]


def _node_scorer(estimator: object, X: object, y: object) -> float:
    """A "score" that is the node the fit ran on: the search keeps it per split."""
    return float(sky.instance_info().node)


def test_a_grid_search_on_two_nodes_finds_what_a_local_one_finds() -> None:
    X, y = make_classification(n_samples=200, n_features=8, random_state=0)
    grid = {"max_depth": [1, 2, 4, 8], "min_samples_leaf": [1, 5]}
    scoring = {"accuracy": "accuracy", "node": _node_scorer}

    def search() -> GridSearchCV:
        model = DecisionTreeClassifier(random_state=0)
        return GridSearchCV(model, grid, cv=3, n_jobs=-1, scoring=scoring, refit="accuracy")

    local = search().fit(X, y)
    with sky.ComputePool(nodes=2, plugins=[sky.plugins.sklearn()], console="off") as pool:
        with sky.plugins.joblib.backend(pool):
            remote = search().fit(X, y)
    assert remote.best_params_ == local.best_params_
    assert remote.best_score_ == pytest.approx(local.best_score_)
    np.testing.assert_allclose(
        remote.cv_results_["mean_test_accuracy"], local.cv_results_["mean_test_accuracy"]
    )
    nodes = {int(v) for k in range(3) for v in remote.cv_results_[f"split{k}_test_node"]}
    assert nodes == {0, 1}  # the fits ran on both nodes
    assert {int(v) for v in local.cv_results_["split0_test_node"]} == {0}  # here: "node 0"


def test_the_plugins_install_what_the_workers_need() -> None:
    from skyward.pool.spec import PoolSpec

    spec = PoolSpec(provider=sky.Local())
    sklearn_plugin, joblib_plugin = sky.plugins.sklearn(), sky.plugins.joblib()
    assert sklearn_plugin.transform is not None and joblib_plugin.transform is not None
    assert sklearn_plugin.transform(sky.Image(), spec).pip == ("scikit-learn", "joblib")
    assert joblib_plugin.transform(sky.Image(), spec).pip == ("joblib",)


# ── the pool as joblib's default backend, from the plugins ───────────────────────────────


_WHEEL_CACHE = Path.home() / ".cache" / "skyward-tests" / "wheels"
_SKLEARN = ("scikit-learn", "joblib", "numpy", "scipy", "threadpoolctl")


@pytest.fixture(params=["local", "ssh"])
def make_sklearn_pool(request: pytest.FixtureRequest) -> PoolFactory:
    """Pools on either transport; the SSH hosts install the client's scikit-learn stack
    from the test index."""
    if request.param == "ssh":
        index: PackageIndex = request.getfixturevalue("package_index")
        index.download([f"{name}=={metadata.version(name)}" for name in _SKLEARN], _WHEEL_CACHE)
    return pool_factory(request.param, request)


def _pid_scorer(estimator: object, X: object, y: object) -> float:
    """A "score" that is the process the fit ran in."""
    import os

    return float(os.getpid())


def _worker_scorer(estimator: object, X: object, y: object) -> float:
    """A "score" that is the worker the fit ran on."""
    return float(sky.instance_info().global_worker_index)


def _active_backend() -> type:
    return type(joblib.parallel.get_active_backend()[0])


@pytest.mark.timeout(600)
def test_inside_a_sklearn_pool_n_jobs_runs_on_the_workers_and_joblib_is_itself_after(
    make_sklearn_pool: PoolFactory,
) -> None:
    X, y = make_classification(n_samples=120, n_features=6, random_state=0)
    grid = {"max_depth": [1, 2, 3, 4, 6, 8], "min_samples_leaf": [1, 5]}
    scoring = {"accuracy": "accuracy", "pid": _pid_scorer, "worker": _worker_scorer}
    before = _active_backend()
    version = metadata.version("scikit-learn")
    with make_sklearn_pool(
        nodes=2, workers_per_node=2, plugins=[sky.plugins.sklearn(version=version)]
    ) as pool:
        assert pool.image.pip == (f"scikit-learn=={version}", "joblib")
        workers = set(pool.broadcast(os.getpid))
        sent = pool.statistics().submitted
        assert joblib.effective_n_jobs(-1) == 4  # every worker's slot
        # A filter whose category only the client can import (the SSH hosts have no pytest)
        # travels inside every task scikit-learn makes.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=pytest.PytestWarning)
            search = GridSearchCV(
                DecisionTreeClassifier(random_state=0),
                grid,
                cv=3,
                n_jobs=-1,
                scoring=scoring,
                refit="accuracy",
            ).fit(X, y)
        fits = pool.statistics().submitted - sent
    pids = {int(v) for k in range(3) for v in search.cv_results_[f"split{k}_test_pid"]}
    ran_on = {int(v) for k in range(3) for v in search.cv_results_[f"split{k}_test_worker"]}
    assert pids <= workers and os.getpid() not in pids
    assert len(ran_on) > 1 and ran_on <= {0, 1, 2, 3}
    assert fits >= 4  # joblib's batches went through pool.submit
    assert _active_backend() is before  # the pool is closed: joblib's default is back
    assert (
        search.best_params_
        == GridSearchCV(DecisionTreeClassifier(random_state=0), grid, cv=3).fit(X, y).best_params_
    )


def _square(i: int) -> int:
    return i * i


def test_a_pool_closed_from_another_thread_gives_the_starting_thread_its_joblib_back() -> None:
    before = _active_backend()
    pool = sky.ComputePool(nodes=1, plugins=[sky.plugins.joblib()], console="off").start()
    try:
        assert _active_backend() is not before
        assert joblib.Parallel(n_jobs=-1)(joblib.delayed(_square)(i) for i in range(4)) == [
            0,
            1,
            4,
            9,
        ]
    finally:
        closer = threading.Thread(target=pool.close)
        closer.start()
        closer.join(60)
    assert pool.statistics().state == "closed"
    assert _active_backend() is before


def test_joblib_and_sklearn_in_one_pool_install_one_backend_and_both_packages() -> None:
    before = _active_backend()
    with sky.ComputePool(
        plugins=[sky.plugins.joblib(version="1.6.0"), sky.plugins.sklearn()], console="off"
    ) as pool:
        assert pool.image.pip == ("joblib==1.6.0", "scikit-learn")  # joblib once, as pinned
        config = joblib.parallel.get_active_backend()
        assert config[0].pool is pool and config[1] == -1
        assert joblib.Parallel()(joblib.delayed(_where)(i) for i in range(3))[2][0] == 4
    assert _active_backend() is before


def test_the_pool_is_the_default_only_in_the_thread_that_started_it() -> None:
    seen: list[type] = []
    with sky.ComputePool(plugins=[sky.plugins.joblib()], console="off"):
        other = threading.Thread(target=lambda: seen.append(_active_backend()))
        other.start()
        other.join(30)
        here = _active_backend()
    assert here.__name__ == "SkywardBackend" and seen[0].__name__ != "SkywardBackend"
