"""joblib's loops, and scikit-learn's n_jobs, run on the pool's nodes."""

from __future__ import annotations

import joblib
import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV
from sklearn.tree import DecisionTreeClassifier

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
