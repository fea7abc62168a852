"""The `keras-vit` command.

    keras-vit models [--json]
    keras-vit predict IMAGE... --model ViTB16 --weights NAME_OR_PATH [--top 5]
                     [--image-size S] [--labels FILE] [--json]
    keras-vit explain IMAGE... --model auto --weights CKPT.npz --out DIR [--json]
    keras-vit train --model ViTB16 --weights imagenet21k --data tfds:cifar10 ...
    keras-vit evaluate MODEL.keras --data SOURCE
    keras-vit export MODEL.keras --format saved_model|tflite
                     [--quantize none|float16|dynamic|int8] [--calibration SOURCE]
                     [--validation SOURCE] --out PATH [--json]
    keras-vit quickstart
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads

from keras_vit.models.variants import ALL_VARIANTS
from keras_vit.weights import registry


def _variant_rows():
    rows = []
    for function, v in ALL_VARIANTS.items():
        cfg = dict(v.config)
        if "resnet_layers" in cfg:
            cfg["resnet_layers"] = list(cfg["resnet_layers"])
        rows.append({
            "function": function,
            "variant": v.key,
            "family": v.family,
            "official_name": v.official_name,
            "config": cfg,
            "weights": registry.available_weights(v),
        })
    return rows


def _family_rows():
    rows = []
    for kind, table in (("vit", registry.VIT_FAMILIES), ("mixer", registry.MIXER_FAMILIES)):
        for f in table.values():
            rows.append({
                "weights": f.name,
                "family": kind,
                "description": f.description,
                "resolution": f.resolution,
                "classes": f.classes,
                "pre_logits": f.pre_logits,
                "source": f.source,
                "models": [ALL_VARIANTS_BY_KEY[kind][k] for k in f.files],
            })
    return rows


ALL_VARIANTS_BY_KEY = {
    "vit": {v.key: f for f, v in ALL_VARIANTS.items() if v.family == "vit"},
    "mixer": {v.key: f for f, v in ALL_VARIANTS.items() if v.family == "mixer"},
}


def cmd_models(args, out):
    variants, families = _variant_rows(), _family_rows()
    if args.json:
        print(json.dumps({"models": variants, "weights": families}), file=out)
        return 0
    print("Models (keras_vit.<function>):", file=out)
    print(f"  {'function':<10} {'variant':<9} {'patch':>5} {'hidden':>6} "
          f"{'layers':>6} {'heads':>5} {'mlp':>5}  registered weights", file=out)
    for row in variants:
        c = row["config"]
        depth = c.get("num_layers", c.get("num_blocks"))
        heads = c.get("num_heads", "-")
        mlp = c.get("mlp_dim", c.get("channels_mlp_dim"))
        name = ("Mixer-" if row["family"] == "mixer" else "") + row["variant"]
        print(f"  {row['function']:<10} {name:<9} {c['patch_size']:>5} "
              f"{c['hidden_size']:>6} {depth:>6} {heads:>5} {mlp:>5}  "
              f"{', '.join(row['weights']) or '-'}", file=out)
    print("\nCheckpoint families (weights=...):", file=out)
    for row in families:
        print(f"  {row['weights']:<30} {row['family']:<5} {row['resolution']:>3}px "
              f"{row['classes']:>5} classes  pre_logits={'yes' if row['pre_logits'] else 'no':<3} "
              f"{', '.join(row['models'])}  ({row['source']})", file=out)
    print("\nAny AugReg file: weights='augreg:<filename>' (index: "
          f"{registry.url_for('vit_models/augreg', 'index')[:-4]}.csv).", file=out)
    return 0


def _load_images(paths, size):
    import tensorflow as tf

    images = []
    for path in paths:
        try:
            data = tf.io.read_file(path)
            image = tf.io.decode_image(data, channels=3, expand_animations=False)
        except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as error:
            raise ValueError(f"Cannot read image {path!r}: {error.message}") from None
        images.append(tf.image.resize(image, size, method="bilinear").numpy())
    import numpy as np

    return np.stack(images).astype("float32")


def _model_from_args(args):
    """The model of `--model` / `--weights` / `--image-size` (predict, explain)."""
    import keras_vit

    shape = (args.image_size, args.image_size, 3) if args.image_size else None
    if args.model.endswith(".keras"):
        import keras

        return keras.saving.load_model(args.model)
    if args.weights is None:
        raise ValueError(f"--model {args.model!r} needs --weights (a registered name, "
                         "augreg:<file>, URL or path).")
    if args.model == "auto":
        if not args.weights.endswith(".npz"):
            raise ValueError(
                "--model auto reads the architecture from a local official .npz; "
                f"for --weights {args.weights!r} name the model, e.g. --model ViTB16."
            )
        return keras_vit.model_from_checkpoint(args.weights, input_shape=shape)
    if args.model in ALL_VARIANTS:
        return getattr(keras_vit, args.model)(weights=args.weights, input_shape=shape)
    raise ValueError(
        f"Unknown --model {args.model!r}; choose from {sorted(ALL_VARIANTS)}, "
        "'auto' or a .keras file."
    )


def cmd_predict(args, out):
    import keras_vit

    model = _model_from_args(args)
    size = tuple(model.input_shape[1:3])
    images = _load_images(args.images, size)
    probs = model.predict(images, verbose=0)
    labels = None
    if args.labels:
        with open(args.labels, encoding="utf-8") as f:
            labels = [line.rstrip("\n") for line in f if line.strip()]
    elif probs.shape[1] not in keras_vit.preprocessing.LABEL_FILES:
        labels = [f"class_{i}" for i in range(probs.shape[1])]
    decoded = keras_vit.decode_predictions(probs, top=args.top, labels=labels)
    results = [
        {"image": path, "top": [{"index": i, "label": name, "probability": p}
                                for i, name, p in rows]}
        for path, rows in zip(args.images, decoded)
    ]
    if args.json:
        print(json.dumps({"model": args.model, "weights": args.weights,
                          "image_size": list(size), "predictions": results}), file=out)
        return 0
    for result in results:
        print(f"{result['image']}:", file=out)
        for rank, row in enumerate(result["top"], 1):
            print(f"  {rank}. {row['label']:<40} {row['probability']:.4f}  "
                  f"(class {row['index']})", file=out)
    return 0


def cmd_explain(args, out):
    import pathlib

    from keras_vit.inspect import find_vit
    from keras_vit.inspect.plots import explain

    model = _model_from_args(args)
    size = tuple(find_vit(model).input_shape[1:3])
    images = _load_images(args.images, size)
    names = [pathlib.Path(p).stem for p in args.images]
    written = explain(model, images, args.out, names=names)
    if args.json:
        print(json.dumps({"out": args.out, "image_size": list(size), "pictures": written}),
              file=out)
        return 0
    for kind, paths in written.items():
        for path in paths:
            print(f"{kind:<31} {path}", file=out)
    return 0


def cmd_train(args, out):
    from keras_vit.training import train

    results = train(
        args.model, args.data, weights=args.weights, recipe=args.recipe, out=args.out,
        image_size=args.image_size, batch_size=args.batch_size, steps=args.steps,
        epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
        learning_rate=args.learning_rate, sam_rho=args.sam_rho, precision=args.precision,
        strategy=args.strategy, seed=args.seed, train_split=args.train_split,
        val_split=args.val_split, preset=args.preset, data_dir=args.data_dir,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        verbose=2 if args.quiet else 1)
    print(json.dumps(results), file=out)
    return 0


def cmd_evaluate(args, out):
    from keras_vit.training import evaluate

    results = evaluate(args.model_path, args.data, split=args.split,
                       image_size=args.image_size, batch_size=args.batch_size,
                       data_dir=args.data_dir)
    print(json.dumps(results), file=out)
    return 0


def cmd_export(args, out):
    import keras

    from keras_vit import export

    model = keras.saving.load_model(args.model_path)
    common = dict(outputs=args.outputs, validation_data=args.validation,
                  validation_split=args.validation_split, check=not args.no_check,
                  verbose=not args.json)
    if args.format == "saved_model":
        if args.quantize != "none":
            raise ValueError(f"--quantize {args.quantize} applies to --format tflite; "
                             "a SavedModel keeps the model's float weights.")
        report = export.to_saved_model(model, args.out, resize=args.resize,
                                       top_k=args.top_k, **common)
    else:
        report = export.to_tflite(model, args.out, quantization=args.quantize,
                                  representative_data=args.calibration,
                                  batch_size=args.batch_size, **common)
    if args.json:
        print(report.to_json(), file=out)
    return 0


def cmd_quickstart(args, out):
    from keras_vit.training import quickstart

    print("keras-vit quickstart: a ViT (4 blocks, width 64) from scratch on "
          "scikit-learn's digits (1,797 real scans), 32x32, fixed 80/20 split.", file=out)
    results = quickstart(args.out, epochs=args.epochs, verbose=2,
                         export_tflite=not args.no_export)
    print(f"test accuracy {results['test_accuracy']:.2%} in {results['seconds']:.0f} s; "
          f"model saved to {results['model']}", file=out)
    if "tflite_report" in results:
        from keras_vit.export import ExportReport

        print("\nTFLite export (dynamic-range int8), verified against Keras:", file=out)
        fields = {k: v for k, v in results["tflite_report"].items() if k != "size_mb"}
        print(ExportReport(**fields), file=out)
    print(json.dumps(results), file=out)
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-vit",
        description="Vision Transformers / MLP-Mixers with the official checkpoints.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("models", help="list model variants and checkpoint families")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("predict", help="top-k classes of images")
    p.add_argument("images", nargs="+", metavar="IMAGE")
    p.add_argument("--model", default="auto",
                   help="named model, e.g. ViTB16, or 'auto' (default): the "
                        "architecture a local official .npz describes")
    p.add_argument("--weights",
                   help="registered name, augreg:<file>, URL or path to an official .npz")
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--image-size", type=int, default=None,
                   help="input resolution (default: the checkpoint's)")
    p.add_argument("--labels", help="text file with one class name per line")
    p.add_argument("--json", action="store_true", help="one JSON line")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("explain", help="attention rollout, attention distance, position "
                                       "embeddings and filters as PNG pictures")
    p.add_argument("images", nargs="+", metavar="IMAGE")
    p.add_argument("--model", default="auto",
                   help="named model (ViTB16), 'auto' (the architecture of a local official "
                        ".npz) or a .keras file")
    p.add_argument("--weights", help="registered name, augreg:<file>, URL or .npz path")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--out", required=True, help="folder for the PNG files")
    p.add_argument("--json", action="store_true", help="one JSON line listing the files")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("train", help="train or fine-tune with a recipe; ends with a JSON line")
    p.add_argument("--model", default="ViTB16", help="named model or a .keras file")
    p.add_argument("--weights", help="registered name, augreg:<file> or path")
    p.add_argument("--data", required=True, help="tfds:NAME, tfrecord:DIR_OR_GLOB, folder:DIR")
    p.add_argument("--recipe", default="finetune", choices=["finetune", "augreg", "scratch"])
    p.add_argument("--image-size", type=int)
    p.add_argument("--batch-size", type=int, help="global batch size")
    p.add_argument("--steps", type=int, help="total optimizer steps")
    p.add_argument("--epochs", type=int)
    p.add_argument("--steps-per-epoch", type=int)
    p.add_argument("--learning-rate", type=float)
    p.add_argument("--sam-rho", type=float, help="train with SAM at this radius")
    p.add_argument("--precision", default="float32",
                   choices=["float32", "mixed_bfloat16", "mixed_float16"])
    p.add_argument("--strategy", default="auto",
                   choices=["auto", "tpu", "multiworker", "mirrored", "default"])
    p.add_argument("--gradient-accumulation-steps", type=int)
    p.add_argument("--preset", help="keras_vit.data preset (default: the recipe's)")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="test")
    p.add_argument("--data-dir", help="TFDS data directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/keras_vit", help="run directory")
    p.add_argument("--quiet", action="store_true", help="one log line per epoch")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="accuracy of a saved model; one JSON line")
    p.add_argument("model_path", metavar="MODEL.keras")
    p.add_argument("--data", required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--image-size", type=int)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--data-dir")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("export", help="SavedModel or TFLite, verified against Keras")
    p.add_argument("model_path", metavar="MODEL.keras")
    p.add_argument("--format", required=True, choices=["saved_model", "tflite"])
    p.add_argument("--quantize", default="none", choices=["none", "float16", "dynamic", "int8"],
                   help="TFLite quantization (int8 needs --calibration)")
    p.add_argument("--calibration", help="int8 calibration images: a data source "
                                         "(folder:DIR, tfrecord:..., tfds:...), train split")
    p.add_argument("--validation", help="images to verify on: a data source (default: "
                                        "the calibration source's test split, else random "
                                        "pixels)")
    p.add_argument("--validation-split", default="test")
    p.add_argument("--batch-size", type=int, default=1, help="static TFLite batch")
    p.add_argument("--resize", action="store_true",
                   help="SavedModel: accept uint8 images of any size")
    p.add_argument("--top-k", type=int, default=5, help="SavedModel: top_k outputs")
    p.add_argument("--outputs", default="auto", choices=["auto", "logits", "probabilities"],
                   help="what the model outputs (auto reads its head)")
    p.add_argument("--no-check", action="store_true",
                   help="keep an export that misses its accuracy bar")
    p.add_argument("--out", required=True, help="SavedModel directory or .tflite file")
    p.add_argument("--json", action="store_true", help="the report as one JSON line")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("quickstart", help="train a small ViT on the digits (offline)")
    p.add_argument("--out", default="runs/quickstart")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--no-export", action="store_true", help="skip the TFLite export")
    p.set_defaults(func=cmd_quickstart)
    return parser


def main(argv=None, out=None):
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        return args.func(args, out)
    except (ValueError, TypeError, OSError) as error:
        print(f"keras-vit {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
