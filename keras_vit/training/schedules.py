"""Learning-rate schedules of the official code, as serializable Keras
`LearningRateSchedule`s."""

import math

import keras
from keras import ops

from keras_vit import _checks


@keras.saving.register_keras_serializable(package="keras_vit")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup, then cosine or linear decay: `vit_jax/hyper.py`
    `create_learning_rate_schedule`.

    ```
    progress = clip((step - warmup_steps) / (total_steps - warmup_steps), 0, 1)
    cosine:  lr = base * 0.5 * (1 + cos(pi * progress))
    linear:  lr = linear_end + (base - linear_end) * (1 - progress)
    lr *= min(1, step / warmup_steps)            # when warmup_steps > 0
    ```

    Args:
        base_lr: peak learning rate.
        total_steps: steps of the whole run.
        warmup_steps: linear warmup steps (official fine-tuning: 500).
        decay: `"cosine"` or `"linear"`.
        linear_end: final value of the linear decay (official: 1e-5).
        steps_per_update: batches per optimizer update under gradient
            accumulation. Keras calls the schedule with its batch counter
            (`optimizer._iterations`), not with the update count, so the
            schedule divides by this to count `total_steps` and
            `warmup_steps` in updates (without it, 4 batches per update
            would run the schedule 4 times too fast: most updates at
            learning rate 0).

    Example:

    >>> schedule = WarmupDecay(0.03, total_steps=1000, warmup_steps=100)
    >>> [round(float(schedule(step)), 6) for step in (50, 100, 1000)]
    [0.015, 0.03, 0.0]
    """

    def __init__(self, base_lr, total_steps, warmup_steps=0, decay="cosine",
                 linear_end=1e-5, steps_per_update=1):
        if decay not in ("cosine", "linear"):
            raise ValueError(f"Unknown decay {decay!r}; allowed: ('cosine', 'linear').")
        if total_steps <= warmup_steps:
            raise ValueError(
                f"total_steps={total_steps} must exceed warmup_steps={warmup_steps}."
            )
        self.base_lr = float(base_lr)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.linear_end = float(linear_end)
        self.steps_per_update = _checks.positive_int(steps_per_update, "steps_per_update")

    def __call__(self, step):
        step = ops.cast(step, "float32")
        if self.steps_per_update > 1:
            step = ops.floor(step / self.steps_per_update)
        progress = (step - self.warmup_steps) / float(self.total_steps - self.warmup_steps)
        progress = ops.clip(progress, 0.0, 1.0)
        if self.decay == "cosine":
            lr = self.base_lr * 0.5 * (1.0 + ops.cos(math.pi * progress))
        else:
            lr = self.linear_end + (self.base_lr - self.linear_end) * (1.0 - progress)
        if self.warmup_steps:
            lr = lr * ops.minimum(1.0, step / self.warmup_steps)
        return lr

    def get_config(self):
        """The schedule's arguments (what `from_config` and `.keras` files
        read)."""
        return {
            "base_lr": self.base_lr, "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps, "decay": self.decay,
            "linear_end": self.linear_end, "steps_per_update": self.steps_per_update,
        }
