"""Access to the official parity fixtures in tests/fixtures/official.

Found through `KERAS_VIT_FIXTURES` (default: `tests/fixtures` in this
repository; see its README for their provenance). A missing fixture fails the
test that needs it, with the path that was searched: the parity tests are the
library's headline claim and never skip.
"""

import json
import os
import pathlib

import numpy as np
import pytest

import keras_vit

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = pathlib.Path(
    os.environ.get("KERAS_VIT_FIXTURES", REPO_ROOT / "tests" / "fixtures")
)
OFFICIAL = FIXTURES / "official"
TOOLS = OFFICIAL
NAMES = ["vit_tiny_token", "vit_tiny_gap", "mixer_tiny", "r26_vit_tiny", "rstem_vit_tiny"]


def require(path):
    path = pathlib.Path(path)
    if not path.exists():
        message = (
            f"official fixture {path} not found (looked in KERAS_VIT_FIXTURES="
            f"{FIXTURES}); the fixtures ship in tests/fixtures/official"
        )
        pytest.fail(message)
    return path


class Fixture:
    """One official fixture: config, checkpoint path and reference outputs."""

    def __init__(self, name):
        self.name = name
        self.config = json.loads(require(OFFICIAL / f"{name}.json").read_text())
        self.checkpoint = str(require(OFFICIAL / f"{name}.npz"))
        self.io = dict(np.load(require(OFFICIAL / f"{name}_io.npz")))
        self.image_size = self.config["image_size"]
        self.resize_to = self.config.get("resize_to")
        self.is_mixer = self.config["model_type"] != "ViT"

    def architecture(self):
        m = self.config["model"]
        patch = tuple(m["patches"]["size"])
        if self.is_mixer:
            return keras_vit.MLPMixer, dict(
                patch_size=patch, hidden_size=m["hidden_dim"],
                num_blocks=m["num_blocks"], tokens_mlp_dim=m["tokens_mlp_dim"],
                channels_mlp_dim=m["channels_mlp_dim"],
            )
        t = m["transformer"]
        kwargs = dict(
            patch_size=patch, hidden_size=m["hidden_size"],
            num_layers=t["num_layers"], num_heads=t["num_heads"],
            mlp_dim=t["mlp_dim"], classifier=m["classifier"],
        )
        if m.get("resnet"):
            kwargs.update(resnet_layers=tuple(m["resnet"]["num_layers"]),
                          resnet_width=m["resnet"]["width_factor"])
        return keras_vit.VisionTransformer, kwargs

    def build(self, **overrides):
        builder, kwargs = self.architecture()
        kwargs.setdefault("weights", self.checkpoint)
        kwargs.update(overrides)
        return builder(**kwargs)


def assert_close(actual, expected, scale=None):
    """The fixture README's tolerance: rtol 1e-5, atol 2e-5 (x max|ref| for
    activations)."""
    atol = 2e-5 if scale is None else 2e-5 * scale
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-5, atol=atol)
