"""TFLite size and latency per quantization mode, against float32 TFLite
and the Keras model in the same run.

A full-size model (default ViT-S/16 at 224, 1000 classes) with seeded
random weights (sizes and latencies do not depend on the values) is
exported with `keras_vit.export.to_tflite` in each mode. Latency: one image
per call through the LiteRT interpreter (`ai-edge-litert`, all cores),
median of `--repeats` calls, rounds interleaved across modes, median of the
rounds. The peers: float32 TFLite (speed-up and size ratios) and the Keras
model (one traced call per image). Full int8 is calibrated on crops of
scikit-learn's two sample photos (real photographs).

Top-1 agreement on real data is measured on a trained model by the
quickstart (`keras-vit quickstart`) and in `tests/test_training.py`; random
weights give no meaningful agreement, so it is not reported here.

    python benchmarks/export.py [--model ViTS16] [--modes none,float16,dynamic,int8]
                                [--rounds 3] [--repeats 10] [--json]
"""

import argparse
import json
import os
import statistics
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import export  # noqa: E402
from keras_vit.export._measure import keras_latency_ms, median_ms  # noqa: E402
from keras_vit.export.tflite import _interpreter  # noqa: E402


def photo_crops(count, size, seed=0):
    """Random crops of the two scikit-learn sample photos, resized."""
    import tensorflow as tf
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    crops = []
    for i in range(count):
        photo = photos[i % len(photos)]
        side = int(rng.integers(160, min(photo.shape[:2])))
        top = int(rng.integers(0, photo.shape[0] - side))
        left = int(rng.integers(0, photo.shape[1] - side))
        crop = photo[top:top + side, left:left + side].astype("float32")
        crops.append(tf.image.resize(crop, (size, size)).numpy())
    return np.stack(crops)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViTS16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--modes", default="none,float16,dynamic,int8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    modes = args.modes.split(",")

    model = getattr(keras_vit, args.model)(weights=None, classes=1000,
                                           input_shape=(args.image_size, args.image_size, 3),
                                           classifier_activation=None)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.05
                       for w in model.get_weights()])
    image = photo_crops(1, args.image_size, seed=1)
    calibration = photo_crops(32, args.image_size) if "int8" in modes else None

    results, runners = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            path = os.path.join(tmp, f"{mode}.tflite")
            report = export.to_tflite(model, path, quantization=mode,
                                      representative_data=calibration, validation_data=image,
                                      latency_repeats=1, check=False, verbose=False)
            results[mode] = {"size_mb": round(report.size_mb, 2),
                             "ops": sum(report.ops.values()), "latency_ms": []}
            runners[mode] = _interpreter(path).get_signature_runner("serving_default")
        keras_times = []
        for _ in range(args.rounds):
            for mode in modes:
                results[mode]["latency_ms"].append(
                    median_ms(lambda mode=mode: runners[mode](images=image), args.repeats))
            keras_times.append(keras_latency_ms(model, image, args.repeats))

    keras_ms = statistics.median(keras_times)
    base = results.get("none")
    rows = []
    for mode in modes:
        r = results[mode]
        latency = statistics.median(r["latency_ms"])
        row = {"mode": mode, "size_mb": r["size_mb"], "ops": r["ops"],
               "latency_ms": round(latency, 2),
               "keras_over_tflite": round(keras_ms / latency, 2)}
        if base:
            fp32 = statistics.median(base["latency_ms"])
            row["speedup_vs_fp32"] = round(fp32 / latency, 2)
            row["size_vs_fp32"] = round(r["size_mb"] / base["size_mb"], 3)
        rows.append(row)
    summary = {"model": args.model, "image_size": args.image_size, "cores": os.cpu_count(),
               "keras_latency_ms": round(keras_ms, 2), "rounds": args.rounds,
               "repeats": args.repeats, "modes": rows}
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{args.model} at {args.image_size}, {os.cpu_count()} cores; Keras: "
          f"{keras_ms:.1f} ms/image (median of {args.rounds} rounds x {args.repeats})")
    print(f"{'mode':<9}{'size MB':>9}{'ops':>6}{'ms/image':>10}{'vs fp32':>9}{'size/fp32':>11}")
    for row in rows:
        print(f"{row['mode']:<9}{row['size_mb']:>9.1f}{row['ops']:>6}{row['latency_ms']:>10.1f}"
              f"{row.get('speedup_vs_fp32', float('nan')):>8.2f}x"
              f"{row.get('size_vs_fp32', float('nan')):>11.3f}")


if __name__ == "__main__":
    main()
