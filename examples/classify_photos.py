"""Demo: load official-format checkpoints and classify real photos.

Runs offline. For every official-format checkpoint in the shared fixtures
(`$KERAS_VIT_FIXTURES`, default `tests/fixtures` in the repository)
it builds the model the file describes (`keras_vit.model_from_checkpoint`),
classifies the two scikit-learn sample photos (four crops) stored with it,
and compares the logits with the official JAX implementation's, also after
loading at a higher resolution (position embeddings resized).

Without the fixtures it writes a checkpoint of its own in the official
format (`keras_vit.save_official_weights`) and reads it back: a round trip,
which it says is no parity check.

    python examples/classify_photos.py [--json]
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

import keras_vit

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = pathlib.Path(
    os.environ.get("KERAS_VIT_FIXTURES", ROOT / "tests" / "fixtures")
) / "official"
CROPS = ["china (centre)", "flower (centre)", "china (pagoda)", "flower (detail)"]


def softmax(z):
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def check_fixture(name):
    config = json.loads((FIXTURES / f"{name}.json").read_text())
    io = np.load(FIXTURES / f"{name}_io.npz")
    path = str(FIXTURES / f"{name}.npz")
    start = time.perf_counter()
    model = keras_vit.model_from_checkpoint(path, classifier_activation=None)
    load_s = time.perf_counter() - start
    logits = model.predict(io["images_uint8"], verbose=0)
    row = {
        "checkpoint": name,
        "model": model.name,
        "parameters": model.count_params(),
        "image_size": config["image_size"],
        "load_seconds": round(load_s, 3),
        "max_abs_diff_vs_official": float(np.abs(logits - io["logits"]).max()),
        "top1_agreement": float((logits.argmax(1) == io["logits"].argmax(1)).mean()),
        "within_tolerance": bool(np.allclose(logits, io["logits"], rtol=1e-5, atol=2e-5)),
        "predictions": [
            {"photo": crop, "class": int(p.argmax()), "probability": float(p.max())}
            for crop, p in zip(CROPS, softmax(logits), strict=True)
        ],
    }
    size = config.get("resize_to")
    if size and config["model_type"] == "ViT":
        resized = keras_vit.model_from_checkpoint(
            path, classifier_activation=None, input_shape=(size, size, 3))
        logits_r = resized.predict(io[f"images_uint8_{size}"], verbose=0)
        row["resized_to"] = size
        row["max_abs_diff_vs_official_resized"] = float(
            np.abs(logits_r - io[f"logits_{size}"]).max())
        row["within_tolerance"] &= bool(
            np.allclose(logits_r, io[f"logits_{size}"], rtol=1e-5, atol=2e-5))
    return row


def self_contained():
    """No fixtures: our own official-format file, written and read back."""
    from sklearn.datasets import load_sample_images

    photos = np.stack([img[:427, 106:533] for img in load_sample_images().images])
    model = keras_vit.VisionTransformer(
        patch_size=16, hidden_size=192, num_layers=4, num_heads=3, mlp_dim=384,
        input_shape=(224, 224, 3), classes=10, classifier_activation=None)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.05
                       for w in model.get_weights()])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "demo.npz")
        keras_vit.save_official_weights(model, path)
        loaded = keras_vit.model_from_checkpoint(path, classifier_activation=None)
        import tensorflow as tf

        images = tf.image.resize(photos, (224, 224)).numpy()
        a, b = model.predict(images, verbose=0), loaded.predict(images, verbose=0)
    return [{
        "checkpoint": "self-written (random weights)",
        "model": loaded.name,
        "parameters": loaded.count_params(),
        "image_size": 224,
        "max_abs_diff_vs_original": float(np.abs(a - b).max()),
        "within_tolerance": bool(np.array_equal(a, b)),
        "predictions": [{"photo": p, "class": int(c)} for p, c in
                        zip(["china", "flower"], b.argmax(1), strict=True)],
    }]


def outcome(rows, official):
    """`(ok, sentence)`: each outcome its own sentence. Only a comparison
    with the official implementation's logits is called parity."""
    if official:
        bad = [r["checkpoint"] for r in rows if not r["within_tolerance"]]
        if bad:
            return False, (f"NOT all logits within rtol=1e-5, atol=2e-5 of the official "
                           f"implementation's: {', '.join(bad)} differ.")
        return True, (f"All logits within rtol=1e-5, atol=2e-5 of the official "
                      f"implementation's ({len(rows)} checkpoints).")
    row = rows[0]
    if not row["within_tolerance"]:
        return False, (f"The self-written checkpoint does not read back exactly (max |diff| "
                       f"{row['max_abs_diff_vs_original']:.2e}); no parity check was made.")
    return True, (f"No parity check with the official implementation was made (no fixtures "
                  f"in {FIXTURES}); the self-written checkpoint reads back bit for bit.")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    names = sorted(p.name[:-len("_io.npz")] for p in FIXTURES.glob("*_io.npz"))
    if names:
        rows = [check_fixture(n) for n in names]
    else:
        print(f"No official fixtures in {FIXTURES}; running the self-contained "
              "round trip instead.", file=sys.stderr)
        rows = self_contained()
    ok, sentence = outcome(rows, official=bool(names))
    if args.json:
        print(json.dumps({"results": rows, "parity_with_official": bool(names),
                          "passed": ok, "outcome": sentence}))
        return 0 if ok else 1
    for row in rows:
        print(f"\n{row['checkpoint']}: {row['model']}, {row['parameters']:,} parameters, "
              f"{row['image_size']}px")
        for pred in row["predictions"]:
            prob = f" p={pred['probability']:.3f}" if "probability" in pred else ""
            print(f"  {pred['photo']:<16} -> class {pred['class']}{prob}")
        if "max_abs_diff_vs_official" in row:
            print(f"  logits vs official JAX: max |diff| = "
                  f"{row['max_abs_diff_vs_official']:.2e}, top-1 agreement "
                  f"{row['top1_agreement']:.0%}")
        if "resized_to" in row:
            print(f"  loaded at {row['resized_to']}px (position embeddings resized): "
                  f"max |diff| = {row['max_abs_diff_vs_official_resized']:.2e}")
        if "max_abs_diff_vs_original" in row:
            print(f"  written and re-read: max |diff| = {row['max_abs_diff_vs_original']:.2e}")
    print(f"\n{sentence}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
