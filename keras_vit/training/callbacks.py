"""Fault tolerance and logs for `model.fit`."""

import logging
import os

import keras

logger = logging.getLogger("keras_vit")


class TerminateOnNaNWithAdvice(keras.callbacks.Callback):
    """Stops training on a NaN/inf loss and says what to try."""

    def __init__(self):
        super().__init__()
        self.stopped_at = None

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not float("-inf") < float(loss) < float("inf"):
            self.stopped_at = batch
            self.model.stop_training = True
            print(
                f"\nkeras_vit: loss became {loss} at batch {batch}; training stopped. "
                "Try: a lower learning rate (--learning-rate), a longer warmup, "
                "gradient clipping (recipes clip the global norm at 1.0), "
                "--precision float32 instead of mixed_float16, and check the "
                "data for NaNs / labels out of range."
            )


def default_callbacks(out, monitor="val_accuracy"):
    """BackupAndRestore (resume after a kill), the best model, CSV and
    TensorBoard logs, NaN guard. Files under `out`:
    `backup/`, `best.keras`, `log.csv`, `tensorboard/`."""
    os.makedirs(out, exist_ok=True)
    callbacks = [
        keras.callbacks.BackupAndRestore(os.path.join(out, "backup")),
        keras.callbacks.ModelCheckpoint(os.path.join(out, "best.keras"), monitor=monitor,
                                        mode="max", save_best_only=True),
        keras.callbacks.CSVLogger(os.path.join(out, "log.csv"), append=True),
        TerminateOnNaNWithAdvice(),
    ]
    try:
        import tensorboard  # noqa: F401  (tf.summary needs it)
    except ImportError:
        logger.info("TensorBoard logs off: pip install tensorboard "
                    "(or 'keras-vision-transformer[train]').")
    else:
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(out, "tensorboard"),
                                                     write_graph=False))
    return callbacks
