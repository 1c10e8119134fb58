"""Keras 3 on the jax backend, trained data-parallel across a 2-node local pool.

Each node has 2 CPU devices; the keras plugin installs a DataParallel distribution over all
4, and each node feeds ``fit`` only its own shard of the data (``sky.shard``), as each
machine of a real cluster would read its own files. The weights stay identical on every
node because the gradients are averaged across all devices at every step.
"""

import numpy as np

import skyward as sky


@sky.compute
def train(epochs: int) -> dict[str, object]:
    import keras

    keras.utils.set_random_seed(0)  # same initial weights on every node
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1).astype("float32")
    x_mine, y_mine = sky.shard(x, even=True), sky.shard(y, even=True)

    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    history = model.fit(x_mine, y_mine, batch_size=32, epochs=epochs, verbose=0)
    return {
        "loss": [round(v, 4) for v in history.history["loss"]],
        "weights": [w.tolist() for w in model.get_weights()],
        "rows": len(x_mine),
    }


if __name__ == "__main__":
    plugins = [sky.plugins.jax(cpu_devices=2), sky.plugins.keras(backend="jax")]
    with sky.ComputePool(nodes=2, plugins=plugins) as pool:
        results = train(5) @ pool
    for node, out in enumerate(results):
        print(f"node {node}: {out['rows']} rows, loss by epoch {out['loss']}")
    same = all(
        np.allclose(np.array(a), np.array(b))
        for a, b in zip(results[0]["weights"], results[1]["weights"], strict=True)
    )
    print(f"weights identical on both nodes: {same}")
