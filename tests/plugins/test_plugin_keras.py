"""The keras plugin: order rules checked at construction, and real data-parallel training."""

from __future__ import annotations

import os

import numpy as np
import pytest
from support.processes import worker_processes

import skyward as sky

jax_plugin = sky.plugins.jax
keras_plugin = sky.plugins.keras


@pytest.mark.parametrize(
    "plugins",
    [
        [keras_plugin(backend="jax"), jax_plugin()],
        [keras_plugin(backend="jax")],
    ],
    ids=["keras-before-jax", "keras-alone"],
)
def test_keras_on_jax_needs_the_jax_plugin_first_on_several_nodes(
    plugins: list[sky.Plugin],
) -> None:
    with pytest.raises(sky.PluginError, match=r"plugins=\[sky\.plugins\.jax\(\.\.\.\)"):
        sky.ComputePool(nodes=2, plugins=plugins)
    assert not worker_processes()


def test_keras_alone_is_fine_on_one_node_or_another_backend() -> None:
    one = sky.ComputePool(nodes=1, plugins=[keras_plugin(backend="jax")])
    assert one.image.env["KERAS_BACKEND"] == "jax"
    assert "keras" in one.image.pip
    numpy = sky.ComputePool(nodes=2, plugins=[keras_plugin(backend="numpy")])
    assert numpy.image.env["KERAS_BACKEND"] == "numpy"
    torch = sky.ComputePool(nodes=1, plugins=[keras_plugin(backend="torch")])
    assert torch.image.env["KERAS_BACKEND"] == "torch"


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(sky.PluginError, match="backend='pytorch'"):
        keras_plugin(backend="pytorch")  # type: ignore[arg-type]


@sky.compute
def fit(epochs: int) -> dict[str, object]:
    import keras

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(
        sky.shard(x, even=True), sky.shard(y, even=True), batch_size=16, epochs=epochs, verbose=0
    )
    distribution = keras.distribution.distribution()
    return {
        "backend": os.environ["KERAS_BACKEND"],
        "distribution": type(distribution).__name__,
        "devices": len(distribution.device_mesh.devices.flatten()),
        "loss": history.history["loss"],
        "weights": [w.tolist() for w in model.get_weights()],
    }


@pytest.mark.timeout(240)
def test_fit_on_two_nodes_keeps_weights_identical_and_the_loss_falls() -> None:
    plugins = [jax_plugin(cpu_devices=2), keras_plugin(backend="jax")]
    with sky.ComputePool(nodes=2, plugins=plugins, quiet=True) as pool:
        first, second = fit(4) @ pool
    for out in (first, second):
        assert out["backend"] == "jax"
        assert out["distribution"] == "DataParallel"
        assert out["devices"] == 4  # every device of both nodes
        loss = out["loss"]
        assert isinstance(loss, list) and loss[-1] < loss[0]
    for a, b in zip(first["weights"], second["weights"], strict=True):  # type: ignore[call-overload]
        np.testing.assert_array_equal(np.array(a), np.array(b))


@sky.compute
def build_unseeded() -> list[list[float]]:
    import keras

    # No keras.utils.set_random_seed: the plugin must make every node draw the same weights,
    # or jax refuses to place differing copies of a replicated variable.
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    return [w.ravel().tolist() for w in model.get_weights()]


@pytest.mark.timeout(240)
def test_an_unseeded_model_starts_with_the_same_weights_on_every_node() -> None:
    plugins = [jax_plugin(cpu_devices=2), keras_plugin(backend="jax")]
    with sky.ComputePool(nodes=2, plugins=plugins, quiet=True) as pool:
        first, second = build_unseeded() @ pool
    assert first == second
    assert any(value != 0.0 for value in first[0])  # drawn, not zeros
