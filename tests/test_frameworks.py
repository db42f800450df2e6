"""The framework images as the seeds use them: the table of what each must print and the training
cell it must run for one epoch on synthetic data. The sessions themselves run in the seeds'
walk-through (tests/test_seeds_walkthrough.py), one of each image, each printing its version in
the web terminal and training in a notebook kernel.

scripts/test builds the images first (`python -m image_catalog build --heavy`); a missing one
fails here, never skips.
"""

from __future__ import annotations

import re

import pytest

from image_catalog import load_catalog
from image_catalog.build import heavy_names

from .harness import docker_client

pytestmark = [pytest.mark.docker]

KERAS_EPOCH = """
import numpy as np, tensorflow as tf
rng = np.random.default_rng(0)
x = rng.random((256, 8), dtype="float32"); y = (x.sum(axis=1) > 4).astype("float32")
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                             tf.keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy")
history = model.fit(x, y, epochs=1, batch_size=32, verbose=0)
print("trained", len(history.history["loss"]), "epoch(s), loss", history.history["loss"][-1])
"""

TORCH_EPOCH = """
import torch
torch.manual_seed(0)
x = torch.rand(256, 8); y = (x.sum(dim=1, keepdim=True) > 4).float()
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer, loss_fn = torch.optim.Adam(model.parameters()), torch.nn.BCEWithLogitsLoss()
epochs = 0
for _ in range(1):
    for xb, yb in zip(x.split(32), y.split(32)):
        optimizer.zero_grad(); loss = loss_fn(model(xb), yb); loss.backward(); optimizer.step()
    epochs += 1
print("trained", epochs, "epoch(s), loss", loss.item())
"""

#: catalog name: (the module, the version it must report, the training cell)
FRAMEWORKS = {
    "tensorflow-2.17-cpu": ("tensorflow", "2.17.1", KERAS_EPOCH),
    "tensorflow-2.15-cpu": ("tensorflow", "2.15.1", KERAS_EPOCH),
    "pytorch-2.13-cpu": ("torch", "2.13.0+cpu", TORCH_EPOCH),
}


def test_every_heavy_image_of_the_catalog_is_tested_here():
    assert sorted(heavy_names(load_catalog())) == sorted(FRAMEWORKS)


def trained_one_epoch(output: str) -> None:
    """What a training cell printed says one epoch ran, with a finite, sane loss."""
    trained = re.search(r"trained (\d+) epoch\(s\), loss ([0-9.e-]+)", output)
    assert trained, output
    assert trained[1] == "1" and 0 < float(trained[2]) < 10, output


def test_every_heavy_image_is_built_on_this_engine():
    for name in FRAMEWORKS:
        reference = load_catalog().get(name).image
        assert docker_client().images.list(name=reference), (
            f"{reference} is not built: python -m image_catalog build {name}"
        )
