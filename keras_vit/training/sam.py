"""Sharpness-aware minimisation (Foret et al. 2021; for ViTs: Chen et al.,
"When Vision Transformers Outperform ResNets without Pre-training").

`SAMModel(model, rho)` wraps any Keras model; `fit` then takes SAM steps
with whatever optimizer is compiled:

```
g    = grad L(w)                         # at the current weights
e    = rho * g / ||g||                   # ascent to the worst nearby point
g_sam = grad L(w + e)                    # a second forward/backward pass
w    = optimizer.apply(g_sam)            # the weights themselves never moved
```

The perturbed forward pass reads `w + e` through `keras.StatelessScope`, so
the weights are never modified and restored (no assign, nothing to undo).

Backends:
- TensorFlow: under a `tf.distribute` strategy every replica perturbs with
  its own gradient: m-sharpness with m = the per-replica batch, as the SAM
  papers and big_vision do.
- JAX: a stateless `train_step` (two `jax.value_and_grad` passes). Under a
  `keras.distribution` (`DataParallel`, `ModelParallel`) the step is one
  program over the global batch, so the ascent uses the gradient of the
  global batch: m = the global batch, whatever the device count, and the
  same weights as on one device.
- torch: not implemented; `SAMModel` refuses with one sentence.
"""

import keras

from keras_vit import _checks, _compat


def check_backend(rho):
    """SAM's train steps are TensorFlow's and JAX's: one sentence elsewhere."""
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        raise ValueError(
            f"SAM (sam_rho={rho}) has TensorFlow and JAX train steps only; train with "
            f"KERAS_BACKEND=jax or tensorflow, or without SAM on {backend}.")


@keras.saving.register_keras_serializable(package="keras_vit")
class SAMModel(keras.Model):
    """Wraps `model` so that `fit` takes sharpness-aware steps.

    Args:
        model: the model to train (its weights are the trained ones; save
            `sam.model`).
        rho: neighbourhood radius (SAM for ViT: 0.05 fine-tuning, up to 0.2
            from scratch).
        epsilon: added to the gradient norm.

    Example:

    ```python
    sam = keras_vit.training.SAMModel(keras_vit.ViTB16(weights=None, classes=10), rho=0.05)
    sam.compile(keras.optimizers.SGD(0.03, momentum=0.9), loss=..., metrics=["accuracy"])
    sam.fit(train_dataset)
    sam.model.save("model.keras")
    ```
    """

    def __init__(self, model, rho=0.05, epsilon=1e-12, **kwargs):
        super().__init__(**kwargs)
        self.rho = _checks.positive_float(rho, "rho", "the SAM radius")
        check_backend(rho)
        self.model = model
        self.epsilon = float(epsilon)
        if getattr(model, "built", False):
            self.built = True  # its weights are the inner model's, all created

    def call(self, inputs, training=None):
        """The inner model's output: SAM changes the training step, not the
        forward pass."""
        return self.model(inputs, training=training)

    def _loss(self, x, y, sample_weight, values=None):
        if values is None:
            y_pred = self(x, training=True)
        else:
            mapping = list(zip(self.trainable_variables, values, strict=True))
            with keras.StatelessScope(state_mapping=mapping):
                y_pred = self(x, training=True)
        loss = _compat.compute_loss(self, x, y, y_pred, sample_weight, training=True)
        return loss, y_pred

    def train_step(self, *args):
        """One SAM step: the gradient at the weights perturbed by
        `rho * g / |g|`, applied to the unperturbed weights (through
        `keras.StatelessScope`; TensorFlow and JAX)."""
        if keras.backend.backend() == "jax":
            return self._jax_train_step(*args)
        return self._tf_train_step(*args)

    def _tf_train_step(self, data):
        import tensorflow as tf  # the TensorFlow backend only

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        variables = self.trainable_variables
        with tf.GradientTape() as tape:
            loss, y_pred = self._loss(x, y, sample_weight)
            scaled = self.optimizer.scale_loss(loss)
        # the "loss" that fit() logs: at w, not w + e
        _compat.update_loss_tracker(self, loss, tf.shape(tf.nest.flatten(x)[0])[0])
        grads = tape.gradient(scaled, variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for g, v in zip(grads, variables, strict=True)]
        norm = tf.linalg.global_norm(grads)
        scale = self.rho / (norm + self.epsilon)
        perturbed = [tf.convert_to_tensor(v.value) + tf.cast(g * scale, v.dtype)
                     for g, v in zip(grads, variables, strict=True)]
        with tf.GradientTape() as tape:
            tape.watch(perturbed)
            perturbed_loss, _ = self._loss(x, y, sample_weight, perturbed)
            scaled = self.optimizer.scale_loss(perturbed_loss)
        sam_grads = tape.gradient(scaled, perturbed)
        self.optimizer.apply(sam_grads, variables)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _jax_train_step(self, state, data):
        """Keras' JAX `train_step` with SAM's second pass: the state in,
        the state out, nothing assigned. The logged loss and the metrics are
        those at `w`; the dropout seeds advance as in the TensorFlow step
        (the perturbed pass's own updates are dropped)."""
        import jax  # the JAX backend only
        import jax.numpy as jnp

        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        grad_fn = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)
        (_, aux), grads = grad_fn(trainable, non_trainable, metrics_variables, x, y,
                                  sample_weight, training=True,
                                  optimizer_variables=optimizer_variables)
        unscaled_loss, y_pred, non_trainable, metrics_variables = aux
        # The loss may be scaled (mixed precision): the direction g / |g| is not.
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype("float32"))) for g in grads))
        scale = self.rho / (norm + self.epsilon)
        perturbed = [v + (g * scale).astype(v.dtype) for v, g in zip(trainable, grads, strict=True)]
        _, sam_grads = grad_fn(perturbed, non_trainable, metrics_variables, x, y,
                               sample_weight, training=True,
                               optimizer_variables=optimizer_variables)
        trainable, optimizer_variables = self.optimizer.stateless_apply(
            optimizer_variables, sam_grads, trainable)
        logs, metrics_variables = _compat.update_metrics_variables(
            self, metrics_variables, unscaled_loss, x, y, y_pred, sample_weight)
        return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)

    def get_config(self):
        return {"model": keras.saving.serialize_keras_object(self.model),
                "rho": self.rho, "epsilon": self.epsilon, "name": self.name}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["model"] = keras.saving.deserialize_keras_object(config["model"])
        return cls(**config)
