"""Input-pipeline throughput: images/s at 224 from a JPEG TFRecord.

Pipelines, all in one run, interleaved round by round (median of rounds):

- `eval`: decode + resize (keras_vit.data preset "eval"),
- `finetune`: inception crop + flip ("finetune"),
- `augreg`: inception crop + flip + per-image RandAugment(2, 15) + MixUp
  (AugReg "medium2"),
- `keras_randaugment`: the finetune pipeline + Keras core
  `keras.layers.RandAugment(num_ops=2, factor=0.5)` on the batches (the peer).

The TFRecord holds JPEG crops of scikit-learn's two sample photos (real
photographs), 320x426 like a typical ImageNet image, written with
`keras_vit.data.schema`, read from disk each epoch (no cache). tf.data uses
every core (AUTOTUNE); the machine's core count is printed.

    python benchmarks/input_pipeline.py [--images 512] [--rounds 3] [--json]
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
import tensorflow as tf  # noqa: E402

from keras_vit.data import make_dataset, schema  # noqa: E402


def write_records(directory, count, seed=0):
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    path = os.path.join(directory, schema.shard_name("train", 0, 1))
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(count):
            photo = photos[i % 2]
            side = int(rng.integers(240, 420))
            y = int(rng.integers(0, photo.shape[0] - side + 1))
            x = int(rng.integers(0, photo.shape[1] - side + 1))
            crop = tf.image.resize(photo[y:y + side, x:x + side], (320, 320 * 4 // 3))
            data = tf.io.encode_jpeg(tf.cast(crop, tf.uint8), quality=90).numpy()
            writer.write(schema.encode_example(data, i % 2, image_format="JPEG",
                                               height=320, width=426))
    with open(os.path.join(directory, schema.INFO_FILE), "w") as f:
        json.dump({"class_names": ["china", "flower"], "num_classes": 2,
                   "splits": {"train": {"num_examples": count}}}, f)


def pipelines(directory, batch_size):
    source = f"tfrecord:{directory}"
    common = dict(image_size=224, batch_size=batch_size, training=True, seed=0,
                  repeat=True)
    keras_ra = keras.layers.RandAugment(value_range=(0, 255), num_ops=2, factor=0.5, seed=0)
    finetune = make_dataset(source, preset="finetune", **common)
    return {
        "eval": make_dataset(source, preset="eval", **common),
        "finetune": finetune,
        "augreg": make_dataset(source, preset="medium2", **common),
        "keras_randaugment": finetune.map(
            lambda x, y: (keras_ra(x, training=True), y),
            num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE),
    }


def measure(iterator, batches, batch_size):
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch_size / (time.perf_counter() - start)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=512, help="records in the TFRecord")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=16, help="batches timed per round")
    parser.add_argument("--warmup", type=int, default=3, help="batches before timing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as directory:
        write_records(directory, args.images)
        datasets = pipelines(directory, args.batch_size)
        rates = {name: [] for name in datasets}
        for _ in range(args.rounds):
            for name, dataset in datasets.items():
                # One live iterator at a time: no other pipeline prefetches in
                # the background while this one is timed.
                iterator = iter(dataset)
                for _ in range(args.warmup):
                    next(iterator)
                batches = args.batches if name != "keras_randaugment" else max(2, args.batches // 8)
                rates[name].append(measure(iterator, batches, args.batch_size))
                del iterator
    medians = {name: statistics.median(r) for name, r in rates.items()}
    result = {
        "machine": {"cpu_count": os.cpu_count(), "tensorflow": tf.__version__,
                    "keras": keras.__version__},
        "image_size": 224, "batch_size": args.batch_size, "rounds": args.rounds,
        "images_per_second": medians,
        "rounds_images_per_second": rates,
        "augreg_vs_keras_randaugment": medians["augreg"] / medians["keras_randaugment"],
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"Input pipeline at 224, batch {args.batch_size}, {os.cpu_count()} cores, "
          f"median of {args.rounds} rounds:\n")
    print("| pipeline | images/s |")
    print("| --- | ---: |")
    for name, value in medians.items():
        print(f"| {name} | {value:,.0f} |")
    print(f"\naugreg / keras_randaugment: {result['augreg_vs_keras_randaugment']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
