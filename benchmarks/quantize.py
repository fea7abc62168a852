"""What `model.quantize(mode)` costs a keras_vit model: top-1 agreement with
the float model and the weights' size for each mode, on a trained digits ViT
and on the official parity fixtures, with a check that each quantized model
reloads (in this process) with the same logits.

    python benchmarks/quantize.py --model runs/readme/quickstart/model.keras \\
        --data folder:runs/readme/quickstart/digits --json

`--model` is the quickstart's model (`keras-vit quickstart --out
runs/readme/quickstart`, which `benchmarks/readme_numbers.py` runs first);
its `test` split is the 360 held-out digits. The official fixtures
(`tests/fixtures/official`, synthetic weights) are compared on their four
photo crops: top-1 agreement there is over 4 images, so the logit
difference relative to the largest logit is the number to read. The last
line is one JSON object; it records the CPU.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import sys
import tempfile
import warnings

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from machine import cpu  # noqa: E402  (the same CPU record as the README's)

MODES = ("int8", "int4", "float8")
FIXTURES = ("vit_tiny_token", "vit_tiny_gap", "r26_vit_tiny", "mixer_tiny")


def weight_bytes(model):
    """The bytes of the model's variables (int8 kernels, their scales and
    float8's scale histories included; no optimizer state)."""
    return int(sum(np.asarray(v.numpy()).nbytes for v in model.weights))


def measure(load, images, name):
    """One row per mode: `load()` gives a fresh float model."""
    import keras

    model = load()
    reference = np.asarray(model.predict(images, batch_size=64, verbose=0), "float64")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [{"model": name, "mode": "float32", "top1_agreement": 1.0,
                 "max_abs_diff": 0.0, "relative_diff": 0.0,
                 "weight_bytes": weight_bytes(model)}]
        scale = float(np.abs(reference).max())
        for mode in MODES:
            quantized = load()
            with warnings.catch_warnings():  # Keras names each layer without quantize()
                warnings.simplefilter("ignore", UserWarning)
                quantized.quantize(mode)
            logits = np.asarray(quantized.predict(images, batch_size=64, verbose=0), "float64")
            path = os.path.join(tmp, f"{mode}.keras")
            quantized.save(path)
            reloaded = keras.saving.load_model(path)
            again = np.asarray(reloaded.predict(images, batch_size=64, verbose=0), "float64")
            diff = float(np.abs(logits - reference).max())
            rows.append({
                "model": name, "mode": mode,
                "top1_agreement": float(np.mean(logits.argmax(-1) == reference.argmax(-1))),
                "max_abs_diff": diff, "relative_diff": diff / scale,
                "weight_bytes": weight_bytes(quantized),
                "reload_max_abs_diff": float(np.abs(again - logits).max())})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="runs/readme/quickstart/model.keras")
    parser.add_argument("--data", default="folder:runs/readme/quickstart/digits")
    parser.add_argument("--json", action="store_true", help="only the JSON line on stdout")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    import keras_vit
    from keras_vit.data.sample import sample_images

    os.chdir(ROOT)
    if not os.path.isfile(args.model):
        raise SystemExit(f"--model {args.model!r} does not exist: run `keras-vit quickstart "
                         "--out runs/readme/quickstart` first.")
    trained = keras.saving.load_model(args.model)
    size = tuple(trained.input_shape[1:3])
    digits = sample_images(args.data, "test", image_size=size, count=None)

    def digits_model():
        return keras.saving.load_model(args.model)

    rows = measure(digits_model, digits.images, f"digits ViT ({args.model})")
    fixtures = ROOT / "tests" / "fixtures" / "official"
    for name in FIXTURES:
        io = np.load(fixtures / f"{name}_io.npz")
        images = io["images_uint8"].astype("float32")

        def fixture_model(name=name, images=images):
            return keras_vit.model_from_checkpoint(fixtures / f"{name}.npz",
                                                   input_shape=images.shape[1:],
                                                   classifier_activation=None)

        rows += measure(fixture_model, images, f"official fixture {name}")
    result = {"command": "python benchmarks/quantize.py --model " + args.model + " --data "
                         + args.data + " --json",
              "cpu": cpu(), "date": datetime.date.today().isoformat(),
              "python": platform.python_version(),
              "keras": keras.__version__, "backend": keras.backend.backend(),
              "test_images": len(digits.images), "rows": rows}
    if not args.json:
        for r in rows:
            print(f"{r['model']:<48} {r['mode']:<8} top-1 {100 * r['top1_agreement']:6.2f}%  "
                  f"max|diff| {r['max_abs_diff']:.3g} ({100 * r['relative_diff']:.2f}% of "
                  f"max|logit|)  {r['weight_bytes'] / 1e3:8.0f} KB", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
