"""Where the time of a keras_vit step goes, per TensorFlow op type and per op.

Runs `--steps` traced steps of a model under TensorFlow's profiler and sums
the host time of every executed op (after grappler, so fused kernels appear
as such: `_MklNativeFusedMatMul` is a matmul with its bias and GELU,
`_MklLayerNorm` a whole LayerNorm). Times are per step. Two columns help
read the table: the op type's share of the step, and for the matmul types
the GFLOP/s they reach (the model's counted matmul FLOPs over the summed
matmul time). Ops of the same name in different blocks are summed.

    python benchmarks/profile_ops.py [--model ViTB16] [--batch 8]
        [--dtype float32|bfloat16] [--mode infer|train] [--steps 2]
        [--top 25] [--json]

`infer` profiles a traced `model(x, training=False)`; `train` profiles
`model.train_on_batch` with AdamW. TensorFlow backend only; threads: all
cores for intra-op, one inter-op thread, as benchmarks/bench_models.py.
"""

import argparse
import collections
import glob
import json
import os
import re
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from bench_models import MODELS as BENCH_MODELS, gflop_per_image  # noqa: E402

# keras_vit builder name -> bench_models' model key
MODELS = {spec["keras_vit"]: key for key, spec in BENCH_MODELS.items()}

MATMUL_TYPES = ("MatMul", "_MklMatMul", "_MklNativeFusedMatMul", "_MklBatchMatMulV2",
                "BatchMatMulV2", "_FusedMatMul")


def profile(step, steps):
    """{op name: (op type, seconds per step)} from the profiler's trace."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(steps):
            step()
        tf.profiler.experimental.stop()
        path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0]
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
    ops = collections.defaultdict(float)
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                # TF op events are "scope/name:OpType"; the 12 blocks are summed
                if ":" in name and "/" in name.rsplit(":", 1)[0]:
                    name = re.sub(r"(block|encoderblock)_\d+", r"\1_*", name)
                    ops[name] += event.duration_ps / 1e12 / steps
    return {name.rsplit(":", 1)[0]: (name.rsplit(":", 1)[1], seconds)
            for name, seconds in ops.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViTB16", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--mode", default="infer", choices=("infer", "train"))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.steps < 1 or args.batch < 1:
        parser.error("--steps and --batch must be >= 1")

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(os.cpu_count())
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    import keras_vit

    if args.dtype == "bfloat16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = getattr(keras_vit, args.model)(weights=None, classifier_activation=None)
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (args.batch, 224, 224, 3)).astype("float32")
    labels = rng.integers(0, 1000, args.batch)
    if args.mode == "infer":
        x = tf.constant(images)
        call = tf.function(lambda x: model(x, training=False))

        def step():
            call(x).numpy()
    else:
        model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

        def step():
            model.train_on_batch(images, labels)
    for _ in range(2):  # trace, then one warm call
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    wall = (time.perf_counter() - start) / args.steps

    ops = profile(step, args.steps)
    by_type = collections.Counter()
    for op_type, seconds in ops.values():
        by_type[op_type] += seconds
    total = sum(by_type.values())
    matmul_s = sum(s for t, s in by_type.items() if t in MATMUL_TYPES)
    gflop = gflop_per_image(MODELS[args.model], 224, args.mode) * args.batch
    result = {
        "model": args.model, "batch": args.batch, "dtype": args.dtype, "mode": args.mode,
        "wall_ms": wall * 1e3, "op_ms": total * 1e3, "matmul_ms": matmul_s * 1e3,
        "matmul_gflops": gflop / matmul_s if matmul_s else None,
        "by_type_ms": {t: s * 1e3 for t, s in by_type.most_common()},
        "top_ops_ms": {f"{name}:{t}": s * 1e3 for name, (t, s) in
                       sorted(ops.items(), key=lambda kv: -kv[1][1])[:args.top]},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.model} batch {args.batch} {args.dtype} {args.mode}: {wall * 1e3:.0f} ms "
          f"per step (ops {total * 1e3:.0f} ms); matmuls {matmul_s * 1e3:.0f} ms = "
          f"{result['matmul_gflops']:.0f} GFLOP/s on the counted {gflop:.0f} GFLOP")
    print("\n| op type | ms/step | share |\n| --- | ---: | ---: |")
    for op_type, seconds in by_type.most_common(args.top):
        print(f"| {op_type} | {seconds * 1e3:.1f} | {100 * seconds / total:.1f}% |")
    print("\n| op | type | ms/step |\n| --- | --- | ---: |")
    for name, ms in result["top_ops_ms"].items():
        op, op_type = name.rsplit(":", 1)
        print(f"| {op} | {op_type} | {ms:.1f} |")


if __name__ == "__main__":
    main()
