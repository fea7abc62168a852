"""Weight-loading time: `keras_vit.ViTB16(weights=<local .npz>)` against its
floor, `np.load` of every array plus building the model without weights.

A full-size official-format checkpoint (ImageNet-21k layout: pre_logits 768,
21,843 classes, 103.2 M parameters, 413 MB) is written once with
`keras_vit.weights.save_official_weights` from seeded random weights. Each
round times, in turn:

- `floor`: `np.load` reading every array (the zip CRC is checked as we do),
  then `ViTB16(weights=None, representation_size=768, classes=21843)`;
- `keras_vit`: `ViTB16(weights=path)` (reads, checks every key and shape,
  builds, assigns);

with `keras.backend.clear_session()` between calls; the order alternates
between rounds. Reported: the median over `--rounds` of each and their ratio
(target <= 1.5). The first round is a warm-up (imports, page cache) and is
not counted.

    python benchmarks/load_weights.py [--rounds 5] [--json]
"""

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.weights import save_official_weights  # noqa: E402


def write_checkpoint(path):
    model = keras_vit.ViTB16(weights=None, representation_size=768, classes=21843)
    rng = np.random.default_rng(0)
    model.set_weights([rng.standard_normal(w.shape, dtype="float32") * 0.02
                       for w in model.get_weights()])
    save_official_weights(model, path)
    parameters = model.count_params()  # = the checkpoint's array sizes
    keras.backend.clear_session()
    return parameters


def floor(path):
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    model = keras_vit.ViTB16(weights=None, representation_size=768, classes=21843)
    return model, arrays


def load(path):
    return keras_vit.ViTB16(weights=path)


def timed(function, path):
    start = time.perf_counter()
    result = function(path)
    seconds = time.perf_counter() - start
    del result
    keras.backend.clear_session()
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}.")

    times = {"floor": [], "keras_vit": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "vit_b16_i21k.npz")
        parameters = write_checkpoint(path)
        size_mb = os.path.getsize(path) / 1e6
        for round_ in range(args.rounds + 1):
            order = ["floor", "keras_vit"] if round_ % 2 else ["keras_vit", "floor"]
            for name in order:
                seconds = timed(floor if name == "floor" else load, path)
                if round_:  # round 0 warms up
                    times[name].append(seconds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "checkpoint": {"parameters": parameters, "megabytes": round(size_mb, 1)},
        "rounds": args.rounds,
        "seconds": times,
        "median_seconds": medians,
        "ratio": medians["keras_vit"] / medians["floor"],
        "target_ratio": 1.5,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"ViT-B/16 checkpoint: {parameters / 1e6:.1f} M parameters, {size_mb:.0f} MB")
    print(f"np.load + build (floor): {medians['floor']:.2f} s")
    print(f"ViTB16(weights=path):    {medians['keras_vit']:.2f} s")
    print(f"ratio: {result['ratio']:.2f} (target <= 1.5), median of {args.rounds} rounds")


if __name__ == "__main__":
    main()
