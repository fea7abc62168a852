"""`evaluate`: the classification report of a saved model on a data
source's split (`keras_vit.training.report`: top-1, top-5, per class,
the confusion matrix) and its cross-entropy; what `keras-vit evaluate`
runs. `report_on` is the one pass over labelled batches, which the end of
`train` runs too."""

import logging
import os

import keras
import numpy as np

from keras_vit._saving import load_keras_model
from keras_vit.export.model import output_kind
from keras_vit.inspect.analysis import check_finite_outputs, input_size
from keras_vit.training import curves
from keras_vit.training.datasets import Reading, open_split, pick_val_split, raise_data_error
from keras_vit.training.preflight import check_data_classes
from keras_vit.training.report import Counts, check_plotting, plot_confusion_matrix

logger = logging.getLogger("keras_vit")

# What `evaluate`'s `cross_entropy` is (train's `val_loss` is the training loss).
CROSS_ENTROPY_IS = ("mean cross-entropy of the model's predictions and the true labels, "
                    "without label smoothing (train's val_loss adds the recipe's label "
                    "smoothing)")


def outputs_logits(model):
    """Whether `model` outputs logits (its head, `output_kind`); a model
    whose head says neither is taken to output probabilities."""
    try:
        return output_kind(model) == "logits"
    except ValueError:
        return False


def report_on(model, dataset, class_names, what):
    """The classification report (`report.classification_report`, with
    `cross_entropy`) of `model` on `dataset`'s batches: `(images, one-hot
    labels)`, or `(images, labels, weights)` whose rows of weight 0 are
    padding and left out. One prediction pass, batch by batch; outputs
    that are not finite are the ValueError of `check_finite_outputs`
    naming `what`, and a corrupt file in the pipeline one sentence."""
    from_logits = outputs_logits(model)
    counts = Counts(len(class_names))
    try:
        for batch in dataset.as_numpy_iterator():
            images, onehot = batch[0], batch[1]
            outputs = np.asarray(model.predict_on_batch(images))
            if len(batch) > 2:
                kept = np.asarray(batch[2]) > 0
                images, onehot, outputs = images[kept], onehot[kept], outputs[kept]
            if not len(outputs):
                continue
            check_finite_outputs(outputs.astype("float32"), what, "accuracy")
            losses = keras.losses.categorical_crossentropy(
                onehot.astype("float32"), outputs.astype("float32"), from_logits=from_logits)
            counts.add(np.argmax(onehot, axis=1), outputs, keras.ops.convert_to_numpy(losses))
    except Exception as error:
        raise_data_error(error)
        raise
    return counts.report(class_names, cross_entropy=True)


def evaluate(model_path, data, split=None, image_size=None, batch_size=64,
             data_dir=None, skip_corrupt=False, holdout=0.1, plot=None):
    """The classification report of a saved model on a data source's split.

    `split=None`: `validation` when the data has it, else `test` (a folder
    of class subfolders: its deterministic holdout). The model's class count
    (and its stored class names) must match the data's; otherwise a
    ValueError says both. `plot`: a folder to write `confusion_matrix.png`
    to (scikit-learn and matplotlib: the plots extra).

    Returns the report (`keras_vit.training.report.classification_report`:
    `accuracy` (top-1), `top5_accuracy` (more than 5 classes, else None),
    `balanced_accuracy`, `per_class` (precision, recall, F1 and the
    counts), `confusion_matrix`, `most_confused`), its
    `cross_entropy` (no label smoothing: `cross_entropy_is`), and `model`,
    `data`, `split`, `images`, `class_names`, `skipped_corrupt`, `plot`.

    Example:

    >>> keras_vit.training.evaluate(  # reads a trained model and a folder
    ...     "runs/x/model.keras", "folder:data")  # doctest: +SKIP
    {'accuracy': 0.98, 'top5_accuracy': None, 'balanced_accuracy': 0.98, ...}
    """
    if plot is not None:
        check_plotting()
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
    report = report_on(model, dataset, list(info.class_names), f"{data} (split {split!r})")
    picture = None
    if plot is not None:
        picture = plot_confusion_matrix(report, os.path.join(plot, "confusion_matrix.png"),
                                        f"{os.path.basename(str(model_path))} on {split}")
    return {**report, "cross_entropy_is": CROSS_ENTROPY_IS, "model": str(model_path),
            "data": data, "split": split, "classes": info.num_classes,
            "class_names": list(info.class_names),
            "skipped_corrupt": info.skipped_corrupt if skip_corrupt else None,
            "plot": picture}


def run_report(net, dataset, class_names, split, one_process=True):
    """The report of a run's final model `net` on its validation
    `dataset` (the end of `train`), or None for a job of several
    processes (each would see only its part of the batches: evaluate
    model.keras afterwards)."""
    if not one_process:
        logger.info("The per-class report is left out in a job of several processes; run "
                    "keras-vit evaluate on model.keras for it.")
        return None
    try:
        return report_on(net, dataset, class_names, f"the {split} split")
    except ValueError as error:  # outputs not finite: the run's files stay, without it
        logger.warning("No per-class report: %s", error)
        return None


def run_pictures(out, report):
    """Draws the run folder's `curves.png` (from its log.csv) and, with a
    `report`, `confusion_matrix.png`; returns `{name: path}` of those
    written. A missing matplotlib or scikit-learn is one logged line, not
    a failed run."""
    written = {}
    try:
        written["curves"] = curves.plot_run(out)["curves"]
        if report is not None:
            written["confusion_matrix"] = plot_confusion_matrix(
                report, os.path.join(out, "confusion_matrix.png"),
                f"{os.path.basename(os.path.abspath(out))} on the validation split")
    except (ImportError, OSError, ValueError) as error:  # never a failed run
        logger.warning("The run's pictures were not drawn: %s", error)
    return written
