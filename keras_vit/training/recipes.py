"""Training recipes, each with its source and numbers.

| recipe     | optimizer | lr | schedule | clip | weight decay | batch | source |
| ---------- | --------- | -- | -------- | ---- | ------------ | ----- | ------ |
| `finetune` | SGD, momentum 0.9 | 0.03 (0.01 small data) | 500 warmup, cosine | global norm 1 | none | 512 | ViT paper App. B.1.1, `vit_jax/configs/common.py`: 98.6-99.0% on CIFAR-10 from ImageNet-21k in 500-10k steps at 384 |
| `augreg`   | AdamW (b2 0.999) | 1e-3 | 10k warmup, cosine | global norm 1 | 0.1 decoupled, not on norms, biases, position embedding, class token | 4096 | AugReg paper Sec. 3 (arXiv:2106.10270) |
| `scratch`  | AdamW | 2e-3 | 10% warmup, cosine | global norm 1 | 0.05 (same exclusions) | 64 | small data from scratch (the quickstart: digits, >= 97%) |
"""

import dataclasses

import keras

from keras_vit.training.layer_decay import LayerDecayAdamW, LayerDecaySGD
from keras_vit.training.schedules import WarmupDecay

# Variables never decayed: LayerNorm/GroupNorm scales and offsets, biases,
# the position embedding and the class token.
NO_DECAY = ("bias", "gamma", "beta", "position_embedding", "class_token")


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    optimizer: str              # "sgd" | "adamw"
    learning_rate: float
    warmup_steps: int           # or a fraction of the total steps when < 1
    weight_decay: float
    batch_size: int
    image_size: int             # default input size
    preset: str                 # keras_vit.data preset (`small` below 65 px)
    label_smoothing: float = 0.0
    dropout_rate: float = 0.0
    drop_path_rate: float = 0.0
    global_clipnorm: float = 1.0
    decay: str = "cosine"
    small_data_learning_rate: float = None
    source: str = ""

    def warmup_for(self, total_steps):
        """Warmup updates for a run of `total_steps` updates: never more
        than a tenth of the run (at least 1 from 2 updates on; a short run
        of `finetune`'s 500 warmup updates would spend all of them rising
        to the peak), and none for one update, whose learning rate would
        otherwise be 0 (Keras' first update is step 0)."""
        if self.warmup_steps < 1:
            warmup = max(1, int(self.warmup_steps * total_steps))
        else:
            warmup = int(self.warmup_steps)
        return min(warmup, max(1, total_steps // 10), max(total_steps - 1, 0))

    def batch_for(self, images, replicas=1):
        """`(global batch, why)` when `train` is given no batch size: the
        recipe's, halved while an epoch of `images` training images has
        fewer than `MIN_STEPS_PER_EPOCH` steps, down to `MIN_RECIPE_BATCH`
        (a multiple of `replicas`); `images` None (unknown): the recipe's.
        (With `finetune`'s 512 a folder of 796 images trained one step per
        epoch: 5 updates in 5 epochs.)

        >>> get_recipe("finetune").batch_for(796)
        (64, "the finetune recipe's 512 halved to 64 so that an epoch of the 796 training \
images has at least 10 steps (--batch-size sets it)")
        >>> get_recipe("finetune").batch_for(198)[1]
        "the finetune recipe's 512 halved to 64, the smallest it is halved to: an epoch of \
the 198 training images has 3 steps, fewer than 10 (--batch-size sets a smaller batch)"
        """
        batch = self.batch_size
        while (images and images // batch < MIN_STEPS_PER_EPOCH
               and batch // 2 >= max(MIN_RECIPE_BATCH, replicas)):
            batch //= 2
        batch = max(replicas, batch - batch % replicas)
        if batch == self.batch_size:
            return batch, f"the {self.name} recipe's"
        halved = f"the {self.name} recipe's {self.batch_size} halved to {batch}"
        if images // batch < MIN_STEPS_PER_EPOCH:  # stopped at the floor
            return batch, (f"{halved}, the smallest it is halved to: an epoch of the {images} "
                           f"training images has {images // batch} steps, fewer than "
                           f"{MIN_STEPS_PER_EPOCH} (--batch-size sets a smaller batch)")
        return batch, (f"{halved} so that an epoch of the {images} training images has at "
                       f"least {MIN_STEPS_PER_EPOCH} steps (--batch-size sets it)")


# `train` without a batch size: the recipe's batch is halved until an epoch
# has this many steps, but not below `MIN_RECIPE_BATCH` (scratch's batch).
MIN_STEPS_PER_EPOCH = 10
MIN_RECIPE_BATCH = 64


RECIPES = {
    r.name: r
    for r in [
        Recipe("finetune", "sgd", 0.03, 500, 0.0, 512, 384, "finetune",
               small_data_learning_rate=0.01,
               source="ViT paper App. B.1.1; vit_jax/configs/common.py"),
        Recipe("augreg", "adamw", 1e-3, 10_000, 0.1, 4096, 224, "medium2",
               source="AugReg, arXiv:2106.10270, Sec. 3"),
        Recipe("scratch", "adamw", 2e-3, 0.1, 0.05, 64, 224, "finetune",
               label_smoothing=0.1, source="keras_vit quickstart's optimizer (digits)"),
    ]
}


def get_recipe(name):
    """The `Recipe` named `name` (`"finetune"`, `"augreg"`,
    `"scratch"`: `RECIPES`); a `Recipe` is returned as it is. A
    ValueError names the recipes for another name.

    >>> get_recipe("scratch").optimizer
    'adamw'"""
    if isinstance(name, Recipe):
        return name
    if name not in RECIPES:
        raise ValueError(f"Unknown recipe {name!r}; allowed: {sorted(RECIPES)}.")
    return RECIPES[name]


def make_optimizer(recipe, total_steps, learning_rate=None,
                   gradient_accumulation_steps=None, *, learning_rate_scales=None,
                   ema=None):
    """The recipe's optimizer with its `WarmupDecay` schedule.

    Args:
        recipe: a name or `Recipe`.
        total_steps: optimizer steps of the whole run.
        learning_rate: overrides the recipe's base learning rate.
        gradient_accumulation_steps: accumulate gradients over this many
            batches per update (a large effective batch on small hardware;
            count `total_steps` in updates).
        learning_rate_scales: layer-wise learning-rate decay: `{variable
            path: scale}` (`keras_vit.training.layer_decay_scales(model,
            rate)`); the optimizer is then `LayerDecaySGD` or
            `LayerDecayAdamW`, the recipe's weight decay scaled with each
            variable's rate.
        ema: keep an exponential moving average of the weights with this
            decay (Keras' `use_ema`, `ema_momentum`), e.g. 0.9998.

    Example:

    >>> optimizer = make_optimizer("scratch", total_steps=1_000, ema=0.999)
    >>> optimizer.use_ema, optimizer.ema_momentum
    (True, 0.999)
    """
    recipe = get_recipe(recipe)
    base = learning_rate if learning_rate is not None else recipe.learning_rate
    schedule = WarmupDecay(base, total_steps, recipe.warmup_for(total_steps),
                           decay=recipe.decay,
                           steps_per_update=gradient_accumulation_steps or 1)
    common = dict(learning_rate=schedule, global_clipnorm=recipe.global_clipnorm,
                  gradient_accumulation_steps=gradient_accumulation_steps)
    if ema is not None:
        common.update(use_ema=True, ema_momentum=ema)
    if learning_rate_scales is not None:
        if recipe.optimizer == "sgd":
            return LayerDecaySGD(momentum=0.9, learning_rate_scales=learning_rate_scales,
                                 **common)
        return LayerDecayAdamW(beta_2=0.999, learning_rate_scales=learning_rate_scales,
                               decoupled_weight_decay=recipe.weight_decay,
                               no_decay=NO_DECAY, **common)
    if recipe.optimizer == "sgd":
        return keras.optimizers.SGD(momentum=0.9, **common)
    optimizer = keras.optimizers.AdamW(weight_decay=recipe.weight_decay, beta_2=0.999,
                                       **common)
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    return optimizer
