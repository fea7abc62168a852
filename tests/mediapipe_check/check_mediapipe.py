"""MediaPipe Tasks' ImageClassifier on keras_vit TFLite exports.

Trains a small ViT on scikit-learn's digits (32x32 RGB, names "zero" ...
"nine"), exports it with `keras_vit.export.to_tflite` in every mode
(float32 `none`, `float16`, `dynamic`, `int8`) and once with
`metadata=False`, then opens each file with MediaPipe's `ImageClassifier`
and classifies the two scikit-learn sample photos and held-out digits, at
the model's size (MediaPipe's own resize is then the identity), comparing
its top-1 class name and probabilities with Keras and with LiteRT on the
same file. The two photos are also given at full size (MediaPipe resizes
them; reported, not required).

Two steps, so that they can run in two virtual environments:

    # where keras_vit and TensorFlow are (writes DIR/*.tflite, DIR/reference.npz)
    python tests/mediapipe_check/check_mediapipe.py export DIR
    # where mediapipe is (needs only mediapipe and numpy)
    python tests/mediapipe_check/check_mediapipe.py check DIR
    # or both in one environment that has both
    python tests/mediapipe_check/check_mediapipe.py all DIR

`check` prints a table, writes DIR/results.json and exits with 1 when a
requirement fails: every metadata file opens, MediaPipe's top-1 equals
LiteRT's on every image, float32 equals Keras on every image (probabilities
within 1e-4), quantized files reach their `to_tflite` bar against Keras,
and the metadata=False file is refused.
"""

import argparse
import json
import os
import sys

import numpy as np

SIZE = 32
NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
MODES = ("none", "float16", "dynamic", "int8")
BARS = {"none": 1.0, "float16": 0.99, "dynamic": 0.99, "int8": 0.97}  # export.CHECKS
PHOTOS = ("china.jpg", "flower.jpg")


def export_step(out, epochs=20, num_digits=200, seed=0):
    """Trains, exports, writes DIR/reference.npz and DIR/reference.json."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    from sklearn.datasets import load_digits, load_sample_images

    import keras_vit
    from keras_vit import export

    os.makedirs(out, exist_ok=True)
    data = load_digits()
    gray = (data.images * (255.0 / 16.0))[..., None]  # 8x8, 0..16 -> 0..255
    digits = tf.image.resize(gray, (SIZE, SIZE), method="bilinear").numpy()
    digits = np.repeat(np.clip(np.round(digits), 0, 255).astype("uint8"), 3, -1)
    order = np.random.default_rng(seed).permutation(len(digits))
    train, test = order[:1437], order[1437:]
    keras.utils.set_random_seed(seed)
    model = keras_vit.VisionTransformer(
        patch_size=4, hidden_size=64, num_layers=2, num_heads=4, mlp_dim=128,
        input_shape=(SIZE, SIZE, 3), classes=10, name="digits_vit")
    keras_vit.labels.set_class_names(model, NAMES)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss="sparse_categorical_crossentropy",  # the default softmax head
                  metrics=["accuracy"])
    model.fit(digits[train].astype("float32"), data.target[train], epochs=epochs,
              batch_size=64, verbose=0)
    accuracy = float(model.evaluate(digits[test].astype("float32"), data.target[test],
                                    verbose=0)[1])

    photos_full = [np.asarray(p, "uint8") for p in load_sample_images().images]
    photos = np.stack([np.clip(np.round(tf.image.resize(p, (SIZE, SIZE), antialias=True)
                                        .numpy()), 0, 255).astype("uint8")
                       for p in photos_full])
    chosen = test[:num_digits]
    images = np.concatenate([photos, digits[chosen]])
    tags = [f"photo {name}" for name in PHOTOS] + [
        f"digit #{i} ({NAMES[data.target[i]]})" for i in chosen]
    keras_probs = keras.ops.convert_to_numpy(model(images.astype("float32")))  # softmax

    arrays = {"images": images, "keras": keras_probs,
              "photo_0": photos_full[0], "photo_1": photos_full[1]}
    files, reports = {}, {}
    for mode in MODES:
        path = os.path.join(out, f"digits_{mode}.tflite")
        report = export.to_tflite(
            model, path, quantization=mode, verbose=False, latency_repeats=2,
            representative_data=digits[train[:300]].astype("float32"),
            validation_data=digits[test].astype("float32"), check=False)
        files[mode] = os.path.basename(path)
        reports[mode] = {"size_bytes": report.size_bytes, "passed": report.passed,
                         "top1_agreement": report.top1_agreement,
                         "max_abs_diff": report.max_abs_diff,
                         "metadata": report.metadata["summary"]}
        arrays[f"litert_{mode}"] = export.run_tflite(path, images, output="probabilities")
    plain = os.path.join(out, "digits_none_no_metadata.tflite")
    export.to_tflite(model, plain, metadata=False, verbose=False, latency_repeats=2,
                     validation_data=digits[test[:50]].astype("float32"))
    np.savez(os.path.join(out, "reference.npz"), **arrays)
    info = {"names": NAMES, "tags": tags, "files": files,
            "no_metadata_file": os.path.basename(plain), "reports": reports,
            "keras_test_accuracy": accuracy, "epochs": epochs,
            "versions": {"tensorflow": tf.__version__, "keras": keras.__version__,
                         "keras_vit": keras_vit.__version__}}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"exported to {out}: Keras test accuracy {100 * accuracy:.1f}% after {epochs} "
          f"epochs; {', '.join(files.values())}, {os.path.basename(plain)}")
    return info


def _classifier(path):
    from mediapipe.tasks.python import vision
    from mediapipe.tasks.python.core.base_options import BaseOptions

    options = vision.ImageClassifierOptions(
        base_options=BaseOptions(model_asset_path=path), max_results=-1)
    return vision.ImageClassifier.create_from_options(options)


def _classify(classifier, image, num_classes):
    import mediapipe as mp

    result = classifier.classify(mp.Image(image_format=mp.ImageFormat.SRGB,
                                          data=np.ascontiguousarray(image)))
    heads = [(c.head_name, c.categories) for c in result.classifications]
    categories = result.classifications[0].categories
    probabilities = np.zeros(num_classes)
    for category in categories:
        probabilities[category.index] = category.score
    return [h[0] for h in heads], categories[0].category_name, probabilities


def check_step(out):
    """Runs MediaPipe on the exports of `export_step`; returns (results, ok)."""
    import mediapipe as mp

    with open(os.path.join(out, "reference.json")) as f:
        info = json.load(f)
    ref = np.load(os.path.join(out, "reference.npz"))
    names, tags, images = info["names"], info["tags"], ref["images"]
    keras_top = [names[i] for i in ref["keras"].argmax(-1)]
    photos = [i for i, t in enumerate(tags) if t.startswith("photo")]
    digits = [i for i, t in enumerate(tags) if t.startswith("digit")]
    results = {"mediapipe": mp.__version__, "images": {"photos": len(photos),
                                                        "digits": len(digits)},
               "modes": {}}
    ok = True
    for mode in MODES:
        path = os.path.join(out, info["files"][mode])
        row = {"file": info["files"][mode], "size_bytes": os.path.getsize(path)}
        try:
            classifier = _classifier(path)
        except Exception as error:  # noqa: BLE001 - reported
            row.update(opens=False, error=str(error)[:300])
            results["modes"][mode] = row
            ok = False
            continue
        with classifier:
            got = [_classify(classifier, image, len(names)) for image in images]
            full = [_classify(classifier, ref[f"photo_{i}"], len(names))[1]
                    for i in range(len(photos))]
        heads = got[0][0]
        top = [g[1] for g in got]
        probs = np.stack([g[2] for g in got])
        litert_top = [names[i] for i in ref[f"litert_{mode}"].argmax(-1)]

        def agree(a, b, idx):
            return sum(a[i] == b[i] for i in idx)

        row.update(
            opens=True, heads=heads,
            photos_top1=[top[i] for i in photos], keras_photos_top1=[keras_top[i]
                                                                     for i in photos],
            photos_agree_keras=agree(top, keras_top, photos),
            digits_agree_keras=agree(top, keras_top, digits),
            agree_litert=agree(top, litert_top, range(len(top))),
            max_prob_diff_keras=float(np.abs(probs - ref["keras"]).max()),
            max_prob_diff_litert=float(np.abs(probs - ref[f"litert_{mode}"]).max()),
            full_size_photos_top1=full,
            full_size_photos_agree_keras=sum(f == keras_top[i] for f, i in zip(full, photos, strict=True)))
        passed = (heads == ["probabilities", "logits"] and row["agree_litert"] == len(top)
                  and (row["photos_agree_keras"] + row["digits_agree_keras"])
                  >= BARS[mode] * len(top))
        if mode == "none":
            passed &= row["max_prob_diff_keras"] <= 1e-4
        row["passed"] = bool(passed)
        ok &= passed
        results["modes"][mode] = row
    try:
        _classifier(os.path.join(out, info["no_metadata_file"])).close()
        results["no_metadata"] = {"refused": False}
        ok = False
    except Exception as error:  # noqa: BLE001 - the expected refusal
        results["no_metadata"] = {"refused": True, "error": str(error)[:300]}
    results["passed"] = bool(ok)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return results, ok


def print_results(results):
    n_photos, n_digits = results["images"]["photos"], results["images"]["digits"]
    print(f"mediapipe {results['mediapipe']}: ImageClassifier on {n_photos} photos and "
          f"{n_digits} digits at the model's size")
    print("| mode | opens | heads | top-1 = Keras (photos) | top-1 = Keras (digits) | "
          "top-1 = LiteRT | max |p - Keras| | full-size photos = Keras | passed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode, row in results["modes"].items():
        if not row["opens"]:
            print(f"| {mode} | NO: {row['error']} | | | | | | | no |")
            continue
        total = n_photos + n_digits
        print(f"| {mode} | yes | {', '.join(row['heads'])} | "
              f"{row['photos_agree_keras']}/{n_photos} | {row['digits_agree_keras']}/{n_digits} "
              f"| {row['agree_litert']}/{total} | {row['max_prob_diff_keras']:.2g} | "
              f"{row['full_size_photos_agree_keras']}/{n_photos} | "
              f"{'yes' if row['passed'] else 'NO'} |")
    refusal = results["no_metadata"]
    print("metadata=False file: " + (f"refused ({refusal['error'].splitlines()[0]})"
                                     if refusal["refused"] else "OPENED (unexpected)"))
    print("passed" if results["passed"] else "FAILED")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["export", "check", "all"])
    parser.add_argument("dir")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--digits", type=int, default=200, help="held-out digits to classify")
    args = parser.parse_args(argv)
    if args.step in ("export", "all"):
        export_step(args.dir, epochs=args.epochs, num_digits=args.digits)
    if args.step in ("check", "all"):
        results, ok = check_step(args.dir)
        print_results(results)
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
