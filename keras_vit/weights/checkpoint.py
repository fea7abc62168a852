"""One checkpoint, read: what `keras_vit.weights.resolve` returns for every
source, and what the builders plan and load from.

A `Checkpoint` holds the parameters under their official names with what
else the file says: the arithmetic of the library that wrote it (GELU form,
LayerNorm epsilon, ...), its input normalisation and class names. Each
format's reader makes one, and the file is not opened again: the builder
reads the head and grid (`info`), the model to build (`model_config`), and
calls `load`. The formats:

- `Checkpoint` itself: an official `.npz` (`format="official"`), loaded
  by `keras_vit.weights.official`'s key table;
- `keras_vit.weights.hub.HubCheckpoint`: timm and transformers files
  (their own key names and position-embedding resize);
- `keras_vit.weights.keras_h5.KerasWeightsFile`: a Keras `.weights.h5` of
  a keras_vit model (the arrays of one architecture, no description).

Example:

```python
checkpoint = keras_vit.weights.resolve("ViT-B_16.npz")
checkpoint.info().classes, checkpoint.model_config()[0]   # (21843, "vit")
model = keras_vit.ViTB16(weights=checkpoint)              # no second read
```
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from keras_vit.weights.architecture import (
    CheckpointInfo,
    architecture_from_checkpoint,
    describe,
)
from keras_vit.weights.official import load_official_weights

if TYPE_CHECKING:
    import keras
    import numpy as np


@dataclasses.dataclass(kw_only=True)
class Checkpoint:
    """A checkpoint read into memory (an official `.npz` for this class).

    Attributes:
        source: how messages name it (the name, URL or path as given, or
            the cache entry it was read from).
        format: "official", "keras", "timm" or "transformers".
        path: the local file or folder it was read from.
        params: `{official key: array}` (None for a Keras weights file).
        arithmetic: builder arguments reproducing the writer's arithmetic
            (`gelu`, `layer_norm_epsilon`, `fc_norm`, `resnet_arithmetic`);
            empty: the official arithmetic.
        preprocessing: `{"mean", "std", ...}` on the [0, 1] scale, or None
            (the official `(x - 127.5) / 127.5`).
        class_names: label names the checkpoint carries, or None.
    """

    source: str
    format: str = "official"
    path: str | None = None
    params: dict[str, np.ndarray] | None = None
    arithmetic: dict = dataclasses.field(default_factory=dict)
    preprocessing: dict | None = None
    class_names: list[str] | None = None

    def info(self) -> CheckpointInfo | None:
        """Family, head, pre_logits, classifier and grid; None when the
        checkpoint does not describe itself (a Keras weights file)."""
        return describe(self.params)

    def model_config(self) -> tuple[str, dict]:
        """`(family, builder arguments)` of the model the checkpoint holds:
        `("vit", VisionTransformer kwargs)` or `("mixer", MLPMixer kwargs)`.

        Raises:
            CheckpointMismatchError: the arrays are not those of a complete
                ViT / hybrid / Mixer.
        """
        return architecture_from_checkpoint(self.params)

    def load(self, model: keras.Model, dropped: tuple[str, ...] = ()) -> int:
        """Assigns the weights to `model`, leaving out the keys under the
        `dropped` prefixes (a replaced head); returns the number of weights
        assigned.

        Raises:
            CheckpointMismatchError: the checkpoint does not fit `model`.
        """
        return load_official_weights(model, self.params, self.source, dropped=dropped)
