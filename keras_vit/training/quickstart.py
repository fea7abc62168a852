"""The quickstart: a small ViT trained from scratch on scikit-learn's digits
(1,797 real 8x8 scans of handwritten digits, shipped with scikit-learn; no
download), through the same `make_dataset` + `fit` path as everything else.

The digits are written once as PNG files in class folders (upscaled to
32x32, fixed stratified 80/20 train/test split, seed 0), then trained with
the `scratch` recipe. The trained model is then exported to TFLite with
dynamic-range int8 weights and verified against Keras on the 360 test
digits (`keras_vit.export.to_tflite`).
"""

import json
import os
import subprocess
import sys
import time

import keras_vit
from keras_vit import _atomic, _checks

# This module loads nothing heavy: `keras_vit.training` imports it at load
# (its `quickstart` function shadows the module's name there), and
# `import keras_vit` loads `keras_vit.training` without TensorFlow. So
# TensorFlow, Keras, scikit-learn and the keras_vit modules that load them
# are imported inside the functions ("heavy").

QUICKSTART_MODEL = dict(patch_size=4, hidden_size=64, num_layers=4, num_heads=4,
                        mlp_dim=128, classifier="gap")


def write_digits(root, size=32):
    """Writes `root/{train,test}/<digit>/<i>.png`; returns the counts."""
    import tensorflow as tf  # heavy (see the top)
    from sklearn.datasets import load_digits  # scikit-learn: the `train` extra
    from sklearn.model_selection import train_test_split

    marker = os.path.join(root, "DONE")
    digits = load_digits()
    images = (digits.images * (255.0 / 16.0)).astype("float32")[..., None].repeat(3, -1)
    images = tf.cast(tf.round(tf.image.resize(images, (size, size))), tf.uint8).numpy()
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=0.2, random_state=0, stratify=digits.target)
    if not os.path.exists(marker):
        for split, xs, ys in (("train", x_train, y_train), ("test", x_test, y_test)):
            for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
                folder = os.path.join(root, split, str(y))
                os.makedirs(folder, exist_ok=True)
                _atomic.write_bytes(os.path.join(folder, f"{i:04d}.png"),
                                    tf.io.encode_png(x).numpy())
        _atomic.write_text(marker, "")
    return {"train": len(x_train), "test": len(x_test)}


def quickstart(out="runs/quickstart", epochs=40, verbose=1, export_tflite=True, seed=0,
               overwrite=False):
    """Trains the quickstart model; returns the `train` results dict plus
    `test_accuracy`, and with `export_tflite` the path of
    `OUT/model_dynamic_int8.tflite` (`tflite`) and its verification report
    (`tflite_report`, a dict).

    `out` is a `train` run folder: a finished quickstart there is refused
    (its `model.keras` is never deleted unasked) unless `overwrite=True`
    (`keras-vit quickstart --overwrite`), which removes that run's files
    and trains afresh; a killed one resumes. The digits in `OUT/digits`
    are kept.

    `seed` seeds the initial weights too (`keras.utils.set_random_seed`),
    so a run repeats the README's number (unseeded, the test accuracy of
    the 40 epochs ranges over about two points)."""
    _checks.positive_int(epochs, "epochs")
    _checks.optional(_checks.seed, seed=seed)
    _checks.boolean(overwrite, "overwrite", "--overwrite")
    _checks.boolean(export_tflite, "export_tflite")
    import keras  # heavy (see the top)

    from keras_vit.training.trainer import train  # heavy (see the top)

    data_dir = os.path.join(out, "digits")
    counts = write_digits(data_dir)
    if seed is not None:
        keras.utils.set_random_seed(seed)
    model = keras_vit.VisionTransformer(**QUICKSTART_MODEL, input_shape=(32, 32, 3),
                                        classes=10, classifier_activation=None,
                                        name="quickstart_vit")
    results = train(model, f"folder:{data_dir}", recipe="scratch", out=out,
                    image_size=32, batch_size=64, epochs=epochs, preset="digits",
                    strategy="default", cache=True, verbose=verbose, seed=seed,
                    overwrite=overwrite)
    results["test_accuracy"] = results.pop("val_accuracy")
    results["test_loss"] = results.pop("val_loss")
    results["test_loss_is"] = results.pop("val_loss_is").replace("validation", "test")
    results["train_examples"], results["test_examples"] = counts["train"], counts["test"]
    results["parameters"] = int(model.count_params())
    if export_tflite:
        start = time.perf_counter()
        path = os.path.join(out, "model_dynamic_int8.tflite")
        arguments = {"quantization": "dynamic", "validation_data": f"folder:{data_dir}",
                     "validation_split": "test", "num_validation": counts["test"]}
        if keras.backend.backend() == "tensorflow":
            from keras_vit.export import to_tflite  # heavy (see the top)

            report = to_tflite(model, path, verbose=False, **arguments).to_dict()
        else:  # TFLite conversion needs TensorFlow: the saved model.keras, exported there
            if verbose:
                print(f"Exporting to TFLite in a TensorFlow process (the {keras.backend.backend()} "
                      "backend cannot convert to TFLite) ...", flush=True)
            report = _export_in_tensorflow(results["model"], path, arguments)
        results["tflite"] = report["path"]
        results["tflite_report"] = report
        results["export_seconds"] = round(time.perf_counter() - start, 1)
    return results


_EXPORT = """
import json, sys
import keras
import keras_vit
from keras_vit import _checks
from keras_vit.export import to_tflite
model = keras.saving.load_model(sys.argv[1])
print(to_tflite(model, sys.argv[2], verbose=False, **json.loads(sys.argv[3])).to_json())
"""


def _export_in_tensorflow(model_path, path, arguments):
    """`to_tflite(load_model(model_path), path, **arguments)` in a fresh
    process on the TensorFlow backend; its report as a dict."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = subprocess.run([sys.executable, "-c", _EXPORT, model_path, path,
                             json.dumps(arguments)], env=env, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise RuntimeError(f"The TFLite export of {model_path} in a TensorFlow process "
                           f"failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
