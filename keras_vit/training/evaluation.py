"""`evaluate`: the accuracy and cross-entropy of a saved model on a data
source's split (what `keras-vit evaluate` runs)."""

import keras
import numpy as np

from keras_vit._saving import load_keras_model
from keras_vit.export.model import output_kind
from keras_vit.inspect.analysis import check_finite_outputs, input_size
from keras_vit.training.datasets import Reading, open_split, pick_val_split, raise_data_error
from keras_vit.training.preflight import check_data_classes


# What `evaluate`'s `cross_entropy` is (train's `val_loss` is the training loss).
CROSS_ENTROPY_IS = ("mean cross-entropy of the model's predictions and the true labels, "
                    "without label smoothing (train's val_loss adds the recipe's label "
                    "smoothing)")


def evaluate(model_path, data, split=None, image_size=None, batch_size=64,
             data_dir=None, skip_corrupt=False, holdout=0.1):
    """Accuracy and cross-entropy of a saved model on a data source's split.

    `split=None`: `validation` when the data has it, else `test` (a folder
    of class subfolders: its deterministic holdout). The model's class count
    (and its stored class names) must match the data's; otherwise a
    ValueError says both.

    Example:

    >>> keras_vit.training.evaluate(  # reads a trained model and a folder
    ...     "runs/x/model.keras", "folder:data")  # doctest: +SKIP
    {'accuracy': 0.98, 'cross_entropy': 0.07, 'cross_entropy_is': 'mean cross-entropy ...', ...}
    """
    model = load_keras_model(model_path)
    height, width = input_size(model, image_size)  # predict's check
    if height != width:
        raise ValueError(f"{str(model_path)!r} takes {height}x{width} images, but evaluate "
                         "feeds square images; give a model with a square or dynamic input "
                         "size.")
    reading = Reading(image_size=height, batch_size=batch_size, data_dir=data_dir,
                      skip_corrupt=skip_corrupt, holdout=holdout)
    split, dataset, info = pick_val_split(split, None, lambda s: open_split(data, s, reading))
    check_data_classes(model, info, data)
    try:
        from_logits = output_kind(model) == "logits"
    except ValueError:
        from_logits = False
    model.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=from_logits),
                  metrics=["accuracy"])
    try:
        loss, accuracy = model.evaluate(dataset, verbose=0)
    except Exception as error:
        raise_data_error(error)
        raise
    # NaN or inf outputs make the loss NaN or inf (and an accuracy of argmax ties).
    check_finite_outputs(np.array([loss], "float64"), f"{data} (split {split!r})",
                         "accuracy")
    return {"accuracy": float(accuracy), "cross_entropy": float(loss),
            "cross_entropy_is": CROSS_ENTROPY_IS, "model": str(model_path),
            "data": data, "split": split, "images": info.num_examples,
            "classes": info.num_classes,
            "skipped_corrupt": info.skipped_corrupt if skip_corrupt else None}
