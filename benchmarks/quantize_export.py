"""What each Keras quantization mode (`model.quantize`) costs in each export
format: file size and latency next to the float32 model's in the same
format, measured in the same run.

A full-size model (default ViT-Ti/16 at 224, 1000 classes) with seeded
random weights (sizes and latencies do not depend on the values) is
quantized in each mode (`"int8"`, `"int4"`, `"float8"`) and written in each
format: the `.keras` file itself, SavedModel, ONNX, TFLite and OpenVINO, by
`keras_vit.export` (verification on one image, not checked: random weights
give no meaningful agreement). A format that cannot run a mode as Keras
does says why, and that sentence is the cell. Latency: one image per call
in the format's own runtime (Keras: one traced call; SavedModel: its
`serving_default`; ONNX Runtime; the LiteRT interpreter; OpenVINO's CPU
plugin; all cores), the median of `--repeats` calls, rounds interleaved
over every cell, the median of the rounds. Ratios are against the float32
model in the same format. The CPU is recorded (`machine.py`).

    python benchmarks/quantize_export.py [--model ViTTi16] [--image-size 224]
        [--modes float32,int8,int4,float8] [--formats keras,saved_model,onnx,tflite,openvino]
        [--rounds 3] [--repeats 10] [--json]
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu, describe  # noqa: E402

MODES = ("float32", "int8", "int4", "float8")
FORMATS = ("keras", "saved_model", "onnx", "tflite", "openvino")
SUFFIX = {"keras": ".keras", "saved_model": "", "onnx": ".onnx", "tflite": ".tflite",
          "openvino": ".xml"}


def build(name, image_size, mode, seed=0):
    """The named model with seeded random weights, quantized in `mode`."""
    import keras_vit

    model = getattr(keras_vit, name)(weights=None, classes=1000,
                                     input_shape=(image_size, image_size, 3),
                                     classifier_activation=None)
    # names of its own: the exports' label files and TFLite metadata need no
    # download of the ImageNet-1k names
    keras_vit.labels.set_class_names(model, [f"class_{i}" for i in range(1000)])
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.05
                       for w in model.get_weights()])
    if mode != "float32":
        with warnings.catch_warnings():  # (what a keras_vit import already hides)
            warnings.simplefilter("ignore", UserWarning)
            model.quantize(mode)
    return model


def size_bytes(path):
    """A file's size, a folder's files' total, an IR's `.xml` + `.bin`."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(root, f))
                   for root, _, files in os.walk(path) for f in files)
    total = os.path.getsize(path)
    if path.endswith(".xml"):
        total += os.path.getsize(path[:-4] + ".bin")
    return total


def write(fmt, model, path, image):
    """Writes `model` as `fmt` at `path`; returns a function of one image
    (a batch of 1) that runs it."""
    import tensorflow as tf

    from keras_vit import export

    common = dict(validation_data=image, check=False, verbose=False)
    if fmt == "keras":
        model.save(path)
        call = tf.function(lambda x: model(x, training=False))
        return lambda x: call(tf.constant(x)).numpy()
    if fmt == "saved_model":
        export.to_saved_model(model, path, **common)
        serve = tf.saved_model.load(path).signatures["serving_default"]
        return lambda x: serve(images=tf.constant(x.astype("uint8")))["logits"].numpy()
    if fmt == "onnx":
        from keras_vit.export import onnx

        export.to_onnx(model, path, latency_repeats=1, **common)
        return onnx._runner(path, batch=1)
    if fmt == "tflite":
        from keras_vit.export import tflite

        export.to_tflite(model, path, latency_repeats=1, **common)
        return tflite._runner(path)
    if fmt == "openvino":
        from keras_vit.export import openvino

        export.to_openvino(model, path, latency_repeats=1, **common)
        return openvino._runner(path, batch=1)
    raise ValueError(f"Unknown format {fmt!r}; allowed: {FORMATS}.")


def measure(args):
    """{(mode, fmt): cell}: each cell's size and latencies, or why not."""
    from keras_vit.export._measure import median_ms

    image = np.random.default_rng(1).uniform(0, 255, (1, args.image_size, args.image_size,
                                                      3)).astype("float32")
    cells, runners = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            model = build(args.model, args.image_size, mode)
            for fmt in args.formats:
                path = os.path.join(tmp, f"{mode}_{fmt}{SUFFIX[fmt]}")
                try:
                    runners[mode, fmt] = write(fmt, model, path, image)
                except ValueError as error:  # this format cannot run this mode
                    cells[mode, fmt] = {"error": str(error)}
                    continue
                cells[mode, fmt] = {"size_bytes": size_bytes(path), "latency_ms": []}
                print(f"  wrote {mode} {fmt}: {cells[mode, fmt]['size_bytes'] / 1e6:.2f} MB",
                      file=sys.stderr)
        for _ in range(args.rounds):  # interleaved: the machine's load falls on every cell
            for key, run in runners.items():
                cells[key]["latency_ms"].append(
                    median_ms(lambda run=run: run(image), args.repeats))
    return cells


def rows(cells, modes, formats):
    """One row per (mode, format): MB, ms, and the ratios to float32's."""
    out = []
    for fmt in formats:
        base = cells.get(("float32", fmt), {})
        for mode in modes:
            cell = cells[mode, fmt]
            row = {"mode": mode, "format": fmt}
            if "error" in cell:
                row["error"] = cell["error"]
            else:
                latency = statistics.median(cell["latency_ms"])
                row.update(size_mb=round(cell["size_bytes"] / 1e6, 2),
                           latency_ms=round(latency, 2))
                if "size_bytes" in base:
                    row["size_vs_float32"] = round(cell["size_bytes"] / base["size_bytes"], 2)
                    row["latency_vs_float32"] = round(
                        latency / statistics.median(base["latency_ms"]), 2)
            out.append(row)
    return out


def why(error):
    """The reason in an export's refusal ("... as Keras does: REASON; ...")."""
    return error.partition(" as Keras does: ")[2].split(";")[0] or error


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViTTi16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    args.modes, args.formats = args.modes.split(","), args.formats.split(",")
    import keras

    cells = measure(args)
    report = {
        "model": args.model, "image_size": args.image_size, "cpu": cpu(),
        "date": datetime.date.today().isoformat(), "keras": keras.__version__,
        "backend": keras.backend.backend(), "rounds": args.rounds, "repeats": args.repeats,
        "rows": rows(cells, args.modes, args.formats)}
    if args.json:
        print(json.dumps(report))
        return report
    print(f"{args.model} at {args.image_size}, random weights; {describe(report['cpu'])}, "
          f"{report['cpu']['cores']} cores, {report['date']}, Keras {report['keras']}; "
          f"ms per image: median of {args.rounds} rounds x {args.repeats} calls")
    print("| format | `model.quantize` | size | vs float32 | ms per image | vs float32 |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for row in report["rows"]:
        if "error" in row:
            print(f"| {row['format']} | {row['mode']} | no: {why(row['error'])} | | | |")
            continue
        print(f"| {row['format']} | {row['mode']} | {row['size_mb']:.2f} MB | "
              f"{row.get('size_vs_float32', 1):.2f}x | {row['latency_ms']:.2f} | "
              f"{row.get('latency_vs_float32', 1):.2f}x |")
    return report


if __name__ == "__main__":
    main()
