"""The `keras-vit` command.

    keras-vit [--verbose] [--debug] COMMAND ...
    keras-vit models [--json]
    keras-vit download NAME [--model ViTB16] [--print-url] [--json]
    keras-vit predict IMAGE_OR_DIR... --model ViTB16|auto|MODEL.keras
                     [--weights NAME_OR_PATH] [--top 5] [--image-size S] [--labels FILE]
                     [--outputs auto|logits|probabilities]
                     [--skip-corrupt] [--batch-size 32] [--json]
    keras-vit explain IMAGE... --model auto --weights CKPT.npz --out DIR [--json]
    keras-vit train --model ViTB16 --weights imagenet21k --data tfds:cifar10 ... [--json]
    keras-vit evaluate MODEL.keras --data SOURCE [--split S] [--skip-corrupt] [--json]
    keras-vit export MODEL.keras --format saved_model|tflite|onnx|openvino|timm|transformers
                     [--quantize none|float16|dynamic|int8] [--opset N] [--calibration SOURCE]
                     [--validation SOURCE] [--skip-corrupt] [--no-check] --out PATH [--json]
    keras-vit quickstart [--json]

Errors are one line on stderr, `keras-vit: error: <message>`, exit status 2
(`--debug` adds the traceback), on a line of their own after a progress bar.
An export that misses its bar prints its report (its JSON line with --json,
`"passed": false`), then the error. A `train` run that diverges (NaN/inf loss)
exits with status 1 after its JSON line (`"status": "diverged"`, nulls).
TensorFlow is imported only by the commands that need it, after
`keras_vit._console.quiet()` (`--verbose` keeps its logs).
"""

import argparse
import contextlib
import os
import pathlib
import sys

import keras_vit  # light here: `keras_vit_cli` makes it load its names on first use
from keras_vit import _checks, _console
from keras_vit._image_files import image_paths, image_paths_and_left_out, read_image_file
from keras_vit._saving import check_keras_path as _check_model_file
from keras_vit._saving import load_keras_model
from keras_vit.training import quickstart
from keras_vit.training.precision import compute_policy, warn_if_emulated
from keras_vit.variants import ALL_VARIANTS, effective_patch_size
from keras_vit.weights import registry
from keras_vit.weights.cache import provenance

# NumPy, TensorFlow, Keras and the keras_vit modules that load them are
# imported inside the commands that use them ("heavy"): `keras-vit --help`
# and `keras-vit models` load none of them (tested, and checked in
# tests/test_import_graph.py).


def _keras():
    """Imports TensorFlow and Keras quietly and registers keras_vit's
    serializable classes (the command runs with a lazy `keras_vit`)."""
    _console.load_tensorflow()
    keras_vit._load_all()
    import keras  # heavy (see the top)

    return keras


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
            "pixels_per_token": effective_patch_size(v.config)[0],
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
                "resolutions": {ALL_VARIANTS_BY_KEY[kind][k]: r
                                for k, r in (f.resolutions or {}).items()},
                "classes": f.classes,
                "pre_logits": f.pre_logits,
                "architecture": f.architecture or {},
                "source": f.source,
                "evidence": f.evidence,
                "models": [ALL_VARIANTS_BY_KEY[kind][k] for k in f.files],
            })
    return rows


def _imagenet_rows():
    """What `weights="imagenet"` loads, per named model."""
    rows = []
    for function, v in ALL_VARIANTS.items():
        choice = registry.imagenet_choice(v)
        if choice is None:
            continue
        family = registry.families_for(v)[choice.weights]
        rows.append({"function": function, "weights": choice.weights,
                     "resolution": family.resolution_for(v.key), "top1": choice.top1,
                     "evidence": choice.evidence})
    return rows


ALL_VARIANTS_BY_KEY = {
    "vit": {v.key: f for f, v in ALL_VARIANTS.items() if v.family == "vit"},
    "mixer": {v.key: f for f, v in ALL_VARIANTS.items() if v.family == "mixer"},
}


def cmd_models(args, out):
    variants, families, imagenet = _variant_rows(), _family_rows(), _imagenet_rows()
    if args.json:
        print(_console.json_dumps({"models": variants, "weights": families, "imagenet": imagenet}),
              file=out)
        return 0
    print("Models (keras_vit.<function>):", file=out)
    print(f"  {'function':<10} {'variant':<10} {'patch (grid cells)':>18} "
          f"{'pixels per token':>16} {'hidden':>6} {'layers':>6} {'heads':>5} {'mlp':>5}  "
          "registered weights", file=out)
    for row in variants:
        c = row["config"]
        depth = c.get("num_layers", c.get("num_blocks"))
        heads = c.get("num_heads", "-")
        mlp = c.get("mlp_dim", c.get("channels_mlp_dim"))
        name = ("Mixer-" if row["family"] == "mixer" else "") + row["variant"]
        print(f"  {row['function']:<10} {name:<10} {c['patch_size']:>18} "
              f"{row['pixels_per_token']:>16} {c['hidden_size']:>6} {depth:>6} {heads:>5} "
              f"{mlp:>5}  {', '.join(row['weights']) or '-'}", file=out)
    print("  (patch: its side in cells of the grid the patch embedding reads: pixels, or for "
          "a hybrid (R...) the ResNet stem's outputs;\n   pixels per token: patch x the "
          "stem's stride, the 16 of B/16 and the 32 of R26+S/32)", file=out)
    print("\nCheckpoint families (weights=...):", file=out)
    for row in families:
        print(f"  {row['weights']:<30} {row['family']:<5} {row['resolution']:>3}px "
              f"{row['classes']:>5} classes  pre_logits={'yes' if row['pre_logits'] else 'no':<3} "
              f"{', '.join(row['models'])}  ({row['source']})", file=out)
    print("\nweights='imagenet': the best official ImageNet-1k classifier "
          "(top-1 as the official sources state it):", file=out)
    for row in imagenet:
        top1 = f"{row['top1']:g}%" if row["top1"] is not None else "n/a"
        print(f"  {row['function']:<10} {row['weights']:<25} {row['resolution']:>3}px "
              f"top-1 {top1:<7} ({row['evidence']})", file=out)
    print("\nAny AugReg file: weights='augreg:<filename>' (index: "
          f"{registry.url_for('vit_models/augreg', 'index')[:-4]}.csv).", file=out)
    return 0


def _named_variant(model):
    """`--model`: a named model (`ViTB16`) or an official name (`ViT-B_16`)."""
    if model in ALL_VARIANTS:
        return ALL_VARIANTS[model]
    for variant in ALL_VARIANTS.values():
        if model == variant.official_name:
            return variant
    raise ValueError(
        f"Unknown --model {model!r}; named models: {', '.join(ALL_VARIANTS)}."
    )


def _download_target(name, model):
    """`(variant or None, url, cache file name)` of `keras-vit download`."""
    if name.startswith(("http://", "https://")):
        if model:
            raise ValueError(
                f"--model is for registered names; the URL {name!r} is downloaded as "
                "it is (leave --model out)."
            )
        return None, registry.download_url(name), registry.url_cache_name(name)
    if model:
        variant = _named_variant(model)
    elif name.startswith(registry.AUGREG_PREFIX):
        prefix = name[len(registry.AUGREG_PREFIX):].split("-")[0]
        matches = [v for v in ALL_VARIANTS.values() if v.augreg_name and v.augreg_name == prefix]
        if not matches:
            raise ValueError(
                f"AugReg file {name[len(registry.AUGREG_PREFIX):]!r} starts with no "
                "model's prefix; AugReg prefixes: "
                f"{', '.join(v.augreg_name + '-' for v in ALL_VARIANTS.values() if v.augreg_name)}."
            )
        variant = matches[0]
    else:
        having = [f for f, v in ALL_VARIANTS.items() if name in registry.available_weights(v)]
        if not having:
            names = sorted({n for v in ALL_VARIANTS.values()
                            for n in registry.available_weights(v)})
            raise ValueError(
                f"Unknown weights {name!r}; registered names: {', '.join(names)}, "
                "or an http(s) URL."
            )
        raise ValueError(
            f"The file of weights {name!r} depends on the model: pass --model, one "
            f"of {', '.join(having)}."
        )
    remote = registry.lookup(name, variant, variant.official_name)
    return variant, remote.url, remote.filename


def cmd_download(args, out):
    variant, url, filename = _download_target(args.name, args.model)
    path = registry.cache_path(filename)
    record = {"weights": args.name, "model": variant.function if variant else None,
              "url": url, "path": path, "cached": os.path.exists(path)}
    if args.print_url:
        if args.json:
            print(_console.json_dumps(record), file=out)
        else:
            print(f"URL:     {url}", file=out)
            print(f"Copy to: {path}", file=out)
            file = registry.bucket_file_name(url)
            print(f"(download it on a machine with internet access, e.g. curl -L -o {file} "
                  f"URL, and copy {file} to that path; `weights=` then finds it there)",
                  file=out)
        return 0
    _console.load_tensorflow()  # reading the .npz imports Keras: TensorFlow's logs quiet
    from keras_vit.weights.download import fetch_checkpoint  # heavy (see the top)

    with contextlib.redirect_stdout(sys.stderr):  # stdout is the result (progress: stderr)
        path, params = fetch_checkpoint(url, filename)
    origin = provenance(path)  # where the cached bytes came from (a mirror, ...)
    record.update(path=path, bytes=os.path.getsize(path), arrays=len(params),
                  downloaded_from=origin["url"] if origin else None)
    if args.json:
        print(_console.json_dumps(record), file=out)
    else:
        verb = "Already cached" if record["cached"] else "Downloaded"
        arrays = _console.plural(len(params), "array")
        print(f"{verb}: {path} ({record['bytes'] / 2**20:.1f} MiB, {arrays}, "
              f"from {origin['url'] if origin else 'an unknown origin: no download record'})",
              file=out)
    return 0



def _load_keras_model(path, what="MODEL"):
    _keras()
    return load_keras_model(path, what)


def _decode_image(path, skip_corrupt=False):
    """The uint8 image in `path`; None for a file that cannot be read or
    decoded with `skip_corrupt`, else a ValueError naming it: train's
    sentences (a regular file only: a FIFO or a device is never read; the
    structural check before the decoder)."""
    tf = _console.load_tensorflow()
    from keras_vit.data.augment import decode_image  # heavy (see the top)
    from keras_vit.data.pipeline import (  # heavy (see the top)
        looks_like_image, oversized, too_large_error)

    try:
        data = read_image_file(path)
    except OSError as error:
        if skip_corrupt:
            return None
        raise ValueError(f"Cannot read image file {path!r} ({error.strerror or error}); "
                         "pass --skip-corrupt to skip such files.") from None
    try:
        if not bool(looks_like_image(data)):  # truncated, empty, not an image
            raise tf.errors.InvalidArgumentError(None, None, "")
        large = oversized(data)
        if large:  # never decoded
            if skip_corrupt:
                return None
            raise too_large_error(path, *large, "pass --skip-corrupt to skip such files")
        return decode_image(data)  # upright by its EXIF orientation
    except tf.errors.OpError as error:
        if skip_corrupt:
            return None
        reason = _console._op_error_message(error) if error.message else ""
        raise ValueError(f"Corrupt or non-image file {path!r}"
                         + (f" ({reason})" if reason else "")
                         + "; pass --skip-corrupt to skip such files.") from None


def _decode_images(paths, skip_corrupt=False):
    """(decoded uint8 arrays, kept paths, skipped paths)."""
    images, kept, skipped = [], [], []
    for path in paths:
        image = _decode_image(path, skip_corrupt)
        if image is None:
            skipped.append(path)
            continue
        images.append(image)
        kept.append(path)
    return images, kept, skipped


def _resized_batches(paths, size, batch_size, skipped, skip_corrupt=False):
    """Yields `(pixels, paths)` in the order of `paths`: float32 (n <=
    batch_size, height, width, 3) images, each resized (bilinear) right
    after it is decoded, so that one batch of resized images and one
    full-size image are held at a time. Files that do not decode (with
    `skip_corrupt`) are appended to `skipped`."""
    import numpy as np  # heavy (see the top)
    import tensorflow as tf  # heavy (see the top)

    pixels, kept = [], []
    for path in paths:
        image = _decode_image(path, skip_corrupt)
        if image is None:
            skipped.append(path)
            continue
        pixels.append(tf.image.resize(image, size, method="bilinear").numpy())
        kept.append(path)
        del image  # before the next file is decoded
        if len(pixels) == batch_size:
            yield np.stack(pixels).astype("float32"), kept
            pixels, kept = [], []
    if pixels:
        yield np.stack(pixels).astype("float32"), kept


def _resize(images, size):
    import numpy as np  # heavy (see the top)
    import tensorflow as tf  # heavy (see the top)

    return np.stack([tf.image.resize(image, size, method="bilinear").numpy()
                     for image in images]).astype("float32")


def _load_images(paths, size):
    images, _, _ = _decode_images(image_paths(paths))
    return _resize(images, size)


# The files --model auto reads the architecture of (besides Hub folders and hf://).
CHECKPOINT_SUFFIXES = (".npz", ".safetensors", ".pth", ".pt", ".bin", ".ckpt", ".tar")


def _check_model_args(args):
    """Validates `--model` / `--weights` without importing TensorFlow."""
    model = args.model
    if model.endswith(".keras"):
        given = [flag for flag, value in (("--weights", args.weights),
                                          ("--weights-ema", args.ema)) if value]
        if given:  # never ignored (as train refuses --weights-ema for a .keras model)
            raise ValueError(
                f"{' and '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to a named "
                f"model or --model auto; --model {model!r} is a .keras file that holds its "
                f"own weights: leave {' and '.join(given)} out.")
        _check_model_file(model, "--model")
        return
    hub_folder = os.path.isfile(os.path.join(model, "config.json"))
    if model.endswith(CHECKPOINT_SUFFIXES) or hub_folder:
        what = ("an official checkpoint" if model.endswith(".npz") else
                "a Hugging Face Hub folder" if hub_folder else "a checkpoint")
        raise ValueError(f"--model takes a named model (e.g. ViTB16), 'auto' or a .keras "
                         f"file; got {model!r} ({what}: use --model auto "
                         f"--weights {model}).")
    if model != "auto" and model not in ALL_VARIANTS:
        if os.path.splitext(model)[1] or os.sep in model:
            _check_model_file(model, "--model")
        raise ValueError(f"Unknown --model {model!r}; choose from {sorted(ALL_VARIANTS)}, "
                         "'auto' or a .keras file.")
    given_model = [p for p in getattr(args, "images", None) or () if p.endswith(".keras")]
    if args.weights is None and given_model:  # `predict model.keras image.png`
        raise ValueError(f"{given_model[0]!r} is a Keras model file, not an image: give it "
                         f"as --model {given_model[0]}.")
    if args.weights is None:
        raise ValueError(f"--model {model!r} needs --weights (a registered name, "
                         "augreg:<file>, URL or path).")
    if model != "auto":
        return
    weights = args.weights
    if weights.startswith(("hf://", "http://", "https://")):  # a URL: an official .npz
        return
    if not weights.endswith(CHECKPOINT_SUFFIXES) and not os.path.isdir(weights):
        raise ValueError(
            "--model auto reads the architecture from a local official .npz, a "
            "Hugging Face Hub folder (config.json + model.safetensors or "
            "pytorch_model.bin), a .safetensors or PyTorch file (.pth, .pt, .bin, "
            f".ckpt, .pth.tar), hf://ORG/NAME or the http(s) URL of an official .npz; for "
            f"--weights {weights!r} name the "
            "model, e.g. --model ViTB16.")
    if not os.path.exists(weights):
        raise ValueError(f"Checkpoint not found: {weights!r}.")


def _model_from_args(args):
    """The model of `--model` / `--weights` / `--image-size` (predict, explain)."""
    _check_model_args(args)
    if args.model.endswith(".keras"):
        return _load_keras_model(args.model, "--model")
    _keras()
    shape = (args.image_size, args.image_size, 3) if args.image_size else None
    if args.model == "auto":
        return keras_vit.model_from_checkpoint(args.weights, input_shape=shape, ema=args.ema)
    return getattr(keras_vit, args.model)(weights=args.weights, input_shape=shape,
                                          ema=args.ema)


def _read_labels(path):
    """The non-blank lines of the --labels file (`class_labels` checks
    their count against the model's classes)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    except FileNotFoundError:
        raise ValueError(f"Labels file not found: {path!r}.") from None


def _class_labels(model, args, num_classes):
    """--labels, else `keras_vit.labels.class_labels`: the names stored in
    the model's head, the ImageNet label files (1000 / 21843 classes), or
    class_<i>."""
    from keras_vit.labels import class_labels  # heavy (see the top)

    given = _read_labels(args.labels) if args.labels else None
    what = f"--labels {args.labels!r}" if args.labels else "--labels"
    return class_labels(model, num_classes, given, what=what)[0]


def _probabilities(model, raw, outputs):
    """Softmax of logits; probabilities as they are."""
    import numpy as np  # heavy (see the top)

    from keras_vit.export.model import output_kind  # heavy (see the top)

    try:
        kind = output_kind(model, outputs)
    except ValueError as error:
        raise ValueError(
            f"{str(error).split('; pass ')[0]}; pass --outputs logits or "
            "--outputs probabilities.") from None
    raw = np.asarray(raw, dtype="float64")
    if kind == "logits":
        raw = np.exp(raw - raw.max(axis=1, keepdims=True))
        raw /= raw.sum(axis=1, keepdims=True)
    return raw, kind


def _input_size(model, image_size):
    """(height, width) to resize images to for `model`
    (`keras_vit.inspect.analysis.input_size`, the check evaluate makes too)."""
    from keras_vit.inspect.analysis import input_size  # heavy (see the top)

    return input_size(model, image_size, "--image-size")


def _top_classes(paths, probs, labels, top):
    """The `predictions` entries of `paths` from their probabilities."""
    import numpy as np  # heavy (see the top)

    results = []
    for path, row in zip(paths, probs, strict=True):
        order = np.argsort(-row, kind="stable")[:top]
        results.append({"image": path, "top": [
            {"label": labels[i], "index": int(i), "probability": float(row[i])}
            for i in order]})
    return results


def _check_finite(raw, paths):
    """`raw` outputs (one row per path of `paths`) unless one is NaN or inf
    (`check_finite_outputs`, naming the first such image): a ranking of NaN
    probabilities is no answer."""
    import numpy as np  # heavy (see the top)

    from keras_vit.inspect.analysis import check_finite_outputs  # heavy (see the top)

    raw = np.asarray(raw)
    bad = [path for path, row in zip(paths, raw.reshape(len(raw), -1), strict=True)
           if not np.isfinite(row).all()]
    if bad:
        more = f" and {_console.plural(len(bad) - 1, 'other image')}" if len(bad) > 1 else ""
        check_finite_outputs(raw, f"{bad[0]!r}{more}", "probabilities")
    return raw


def _predictions(model, args, paths, size):
    """`(predictions, skipped paths)`: the images streamed in batches of
    `--batch-size` (decoded, resized, classified; only the top classes
    kept), in the order of `paths`."""
    from keras_vit.export.batches import check_batch_size  # heavy (see the top)

    batch_size = check_batch_size(args.batch_size, size, "--batch-size")
    results, skipped, labels = [], [], None
    for pixels, kept in _resized_batches(paths, size, batch_size, skipped,
                                         args.skip_corrupt):
        raw = model.predict(pixels, batch_size=batch_size, verbose=0)
        _check_finite(raw, kept)
        probs, _ = _probabilities(model, raw, args.outputs)
        labels = labels or _class_labels(model, args, probs.shape[1])
        results += _top_classes(kept, probs, labels, min(args.top, probs.shape[1]))
    return results, skipped


def cmd_predict(args, out):
    _checks.positive_int(args.top, "--top")  # (argparse checked it; a Namespace of a caller)
    paths, left_out = image_paths_and_left_out(args.images)
    _check_model_args(args)
    for sentence in left_out:  # image types keras_vit does not read: counted, never silent
        print(f"{_console.PROG}: {sentence}", file=sys.stderr)
    model = _model_from_args(args)
    warn_if_emulated(compute_policy(model))
    size = _input_size(model, args.image_size)
    results, skipped = _predictions(model, args, paths, size)
    if args.json:
        print(_console.json_dumps({"model": args.model, "weights": args.weights,
                          "image_size": list(size), "predictions": results,
                          "skipped": skipped}), file=out)
    else:
        for result in results:
            print(f"{result['image']}:", file=out)
            for rank, row in enumerate(result["top"], 1):
                print(f"  {rank}. {row['label']:<40} {row['probability']:.4f}  "
                      f"(class {row['index']})", file=out)
    if skipped:
        print(f"{_console.PROG}: skipped {_console.plural(len(skipped), 'unreadable image file')}: "
              f"{', '.join(skipped)}", file=sys.stderr)
    if not results:
        raise ValueError(f"None of the {_console.plural(len(paths), 'image file')} could be "
                         "read." if len(paths) > 1 else f"The image file {paths[0]!r} could not "
                         "be read.")
    return 0


def cmd_explain(args, out):
    paths, left_out = image_paths_and_left_out(args.images)
    _check_model_args(args)
    for sentence in left_out:  # image types keras_vit does not read: counted, never silent
        print(f"{_console.PROG}: {sentence}", file=sys.stderr)
    images, _, _ = _decode_images(paths)
    model = _model_from_args(args)
    from keras_vit.inspect.analysis import stored_image_size  # heavy (see the top)
    from keras_vit.inspect.plots import explain  # heavy (see the top)

    _input_size(model, args.image_size)
    size = stored_image_size(model)  # a model taking any size: its stored grid
    names = [pathlib.Path(p).stem for p in paths]
    written = explain(model, _resize(images, size), args.out, names=names)
    if args.json:
        print(_console.json_dumps({"out": args.out, "image_size": list(size), "pictures": written}),
              file=out)
        return 0
    for kind, paths in written.items():
        for path in paths:
            print(f"{kind:<31} {path}", file=out)
    return 0


def _optional(args, **names):
    """{parameter: value} of the flags the user gave (None: not given), so a
    flag reaches a function only when set (its default applies otherwise)."""
    return {param: getattr(args, attr) for param, attr in names.items()
            if getattr(args, attr, None) is not None}


def _progress_verbosity(args):
    """Keras' `verbose` for `fit`: the live progress bar (1) on a terminal;
    one line per epoch (2) with --quiet or when the progress goes to a file
    or pipe (a bar there is a heap of carriage returns and colour codes)."""
    stream = sys.stderr if args.json else sys.stdout
    return 2 if args.quiet or not stream.isatty() else 1


def cmd_train(args, out):
    if args.ema is _BARE_EMA:
        raise ValueError("--ema takes a decay in (0, 1), e.g. --ema 0.9998 (a moving "
                         "average of the weights while training); a PyTorch checkpoint's "
                         "EMA weights are --weights-ema.")
    if args.model.endswith((".keras", ".npz")) or os.path.splitext(args.model)[1]:
        _check_model_file(args.model, "--model")
    _keras()
    from keras_vit.training import TrainingDivergedError, train  # heavy (see the top)

    extra = _optional(args, holdout="holdout", val_split="val_split",
                      coordinator="coordinator", num_processes="num_processes",
                      process_id="process_id")
    if args.skip_corrupt:
        extra["skip_corrupt"] = True
    if args.no_memory_check:
        extra["check_memory"] = False
    model_kwargs = {key: True for key, flag in (("ema", args.weights_ema),
                                                ("remat", args.remat)) if flag}
    if model_kwargs:
        extra["model_kwargs"] = model_kwargs
    if args.lora_targets is not None:
        extra["lora_targets"] = tuple(t.strip() for t in args.lora_targets.split(","))
    extra.update(_optional(args, lora_rank="lora", layer_decay="layer_decay", ema="ema"))
    # --json: stdout carries only the JSON line; Keras' progress goes to stderr.
    progress = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    try:
        with progress:
            results = train(
                args.model, args.data, weights=args.weights, recipe=args.recipe, out=args.out,
                image_size=args.image_size, batch_size=args.batch_size, steps=args.steps,
                epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                learning_rate=args.learning_rate, sam_rho=args.sam_rho, precision=args.precision,
                strategy=args.strategy, distribution=args.distribution, seed=args.seed,
                train_split=args.train_split,
                preset=args.preset, data_dir=args.data_dir,
                gradient_accumulation_steps=args.gradient_accumulation_steps,
                jit_compile=JIT_COMPILE[args.jit_compile],
                overwrite=args.overwrite, verbose=_progress_verbosity(args), **extra)
    except TrainingDivergedError as error:  # the JSON line still comes, with nulls
        print(_console.json_dumps(error.results), file=out)
        _console.print_error(str(error))
        return 1
    print(_console.json_dumps(results), file=out)
    return 0


def cmd_evaluate(args, out):
    _check_model_file(args.model_path)
    _keras()
    from keras_vit.training import evaluate  # heavy (see the top)

    extra = _optional(args, holdout="holdout")
    if args.skip_corrupt:
        extra["skip_corrupt"] = True
    results = evaluate(args.model_path, args.data, split=args.split,
                       image_size=args.image_size, batch_size=args.batch_size,
                       data_dir=args.data_dir, **extra)
    print(_console.json_dumps(results), file=out)
    return 0


# --jit-compile values: train's jit_compile.
JIT_COMPILE = {"auto": "auto", "on": True, "off": False}


# --quantize values each export --format takes.
EXPORT_QUANTIZE = {"saved_model": ("none",), "tflite": ("none", "float16", "dynamic", "int8"),
                   "onnx": ("none", "dynamic", "int8"), "openvino": ("none", "float16"),
                   "timm": ("none",), "transformers": ("none",)}
# The formats that write a Hugging Face Hub folder (`export.to_hub_folder`).
HUB_FORMATS = ("timm", "transformers")


def cmd_export(args, out):
    if args.format == "saved_model" and args.quantize != "none":
        raise ValueError(f"--quantize {args.quantize} applies to --format tflite; "
                         "a SavedModel keeps the model's float weights.")
    if args.quantize not in EXPORT_QUANTIZE[args.format]:
        formats = [f for f, modes in EXPORT_QUANTIZE.items() if args.quantize in modes]
        raise ValueError(f"--quantize {args.quantize} applies to --format "
                         f"{' or '.join(formats)}; --format {args.format} takes --quantize "
                         f"{'|'.join(EXPORT_QUANTIZE[args.format])}.")
    if args.opset is not None and args.format != "onnx":
        raise ValueError(f"--opset applies to --format onnx; not to --format {args.format}.")
    if args.format != "tflite" and args.batch_size != 1:
        raise ValueError(f"--batch-size applies to --format tflite (a static batch); the "
                         f"{args.format} export takes any batch size.")
    if args.format in ("openvino", *HUB_FORMATS) and args.calibration:
        raise ValueError(f"--calibration applies to --format tflite or onnx (quantization); "
                         f"choose the images the {args.format} export is verified on with "
                         "--validation.")
    if args.no_metadata and args.format != "tflite":
        raise ValueError(f"--no-metadata applies to --format tflite; not to --format "
                         f"{args.format}.")
    model = _load_keras_model(args.model_path)
    from keras_vit import export  # heavy (see the top)

    if args.format == "tflite":  # named as the flag, before any sampling
        from keras_vit.export.batches import check_batch_size  # heavy (see the top)
        from keras_vit.export.model import model_image_size  # heavy (see the top)

        check_batch_size(args.batch_size, model_image_size(model), "--batch-size")

    common = dict(outputs=args.outputs, validation_data=args.validation,
                  check=not args.no_check, verbose=False,
                  skip_corrupt=args.skip_corrupt,
                  **_optional(args, validation_split="validation_split",
                              num_validation="validation_samples", holdout="holdout"))
    try:
        report = _run_export(export, model, args, common)
    except export.ExportVerificationError as error:  # the report still comes, then the error
        _print_report(error.report, args, out)
        raise
    _print_report(report, args, out)
    return 0


def _print_report(report, args, out):
    """The export's report on stdout: one JSON line with --json, else the table."""
    print(report.to_json() if args.json else report, file=out)


def _run_export(export, model, args, common):
    """The `keras_vit.export` call of `--format`; returns its report."""
    if args.format == "saved_model":
        report = export.to_saved_model(model, args.out, resize=args.resize,
                                       top_k=args.top_k, representative_data=args.calibration,
                                       **common)
    elif args.format == "onnx":
        report = export.to_onnx(model, args.out, quantization=args.quantize, opset=args.opset,
                                representative_data=args.calibration, **common,
                                **_optional(args, num_calibration="calibration_samples",
                                            calibration_split="calibration_split"))
    elif args.format == "openvino":
        report = export.to_openvino(model, args.out, quantization=args.quantize, **common)
    elif args.format in HUB_FORMATS:
        report = export.to_hub_folder(model, args.out, library=args.format, **common)
    else:
        tflite = _optional(args, num_calibration="calibration_samples",
                           calibration_split="calibration_split")
        report = export.to_tflite(model, args.out, quantization=args.quantize,
                                  representative_data=args.calibration,
                                  batch_size=args.batch_size,
                                  metadata=not args.no_metadata, **common, **tflite)
    return report


def cmd_quickstart(args, out):
    _keras()
    log = sys.stderr if args.json else out
    print("keras-vit quickstart: a ViT (4 blocks, width 64) from scratch on "
          "scikit-learn's digits (1,797 real scans), 32x32, fixed 80/20 split.", file=log)
    progress = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with progress:
        results = quickstart(args.out, epochs=args.epochs, verbose=2,
                             export_tflite=not args.no_export, overwrite=args.overwrite)
    print(f"test accuracy {results['test_accuracy']:.2%} in {results['seconds']:.0f} s; "
          f"model saved to {results['model']}", file=log)
    if "tflite_report" in results:
        from keras_vit.export import ExportReport  # heavy (see the top)

        print("\nTFLite export (dynamic-range int8), verified against Keras:", file=log)
        fields = {k: v for k, v in results["tflite_report"].items() if k != "size_mb"}
        print(ExportReport(**fields), file=log)
    print(_console.json_dumps(results), file=out)
    return 0


def _global_flags(defaults):
    """--verbose/--debug, accepted before and after the command."""
    parser = argparse.ArgumentParser(add_help=False)
    kw = {} if defaults else {"default": argparse.SUPPRESS}
    parser.add_argument("--verbose", action="store_true", **kw,
                        help="show TensorFlow's and Keras' logs and warnings")
    parser.add_argument("--debug", action="store_true", **kw,
                        help="show the traceback of an error")
    return parser


def _checked(check, parse):
    """An argparse type: `parse` the text, then `check` it (one sentence)."""
    def convert(text):
        try:
            value = parse(text)
        except ValueError:
            value = text
        try:
            return check(value)
        except (TypeError, ValueError) as error:
            raise argparse.ArgumentTypeError(str(error).rstrip(".")) from None
    convert.__name__ = check.__name__  # argparse names the type in some errors
    return convert


def PATH(text):  # noqa: N802  (an argparse type, named as the others)
    """An argparse type: a path that is not empty (`--out ""`)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must be a file or folder path, got {text!r}")
    return text


# `keras-vit train --ema` without a decay (it once meant --weights-ema).
_BARE_EMA = object()
POSITIVE_INT = _checked(_checks.positive_int, int)
NON_NEGATIVE_INT = _checked(_checks.non_negative_int, int)
SEED = _checked(_checks.seed, int)
POSITIVE_FLOAT = _checked(_checks.positive_float, float)
FRACTION = _checked(_checks.fraction, float)


class _Parser(argparse.ArgumentParser):
    """argparse with the command's one-line errors (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser():
    """The `keras-vit` parser: the global flags (before or after the
    command) and one subparser per command."""
    parser = _Parser(
        prog="keras-vit", parents=[_global_flags(True)],
        description="Vision Transformers / MLP-Mixers with the official checkpoints.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="keras-vit COMMAND --help shows its options")
    flags = _global_flags(False)

    def add(name, **kw):
        kw.setdefault("description", kw["help"][0].upper() + kw["help"][1:] + ".")
        return sub.add_parser(name, parents=[flags], **kw)

    for add_command in (_models_parser, _download_parser, _predict_parser, _explain_parser,
                        _train_parser, _evaluate_parser, _export_parser, _quickstart_parser):
        add_command(add)
    return parser


def _models_parser(add):
    """The `keras-vit models` subcommand and its flags."""
    p = add("models", help="list model variants and checkpoint families",
            description="Lists the named models (keras_vit.<function>: patch, width, depth, "
                        "heads, MLP, the weights registered for each), the checkpoint "
                        "families (weights=...) and what weights='imagenet' loads. Reads "
                        "no file and imports no TensorFlow.")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(func=cmd_models)


def _download_parser(add):
    """The `keras-vit download` subcommand and its flags."""
    p = add("download", help="fill the weights cache ahead of time (or, with --print-url, "
                             "say where to copy a file downloaded elsewhere)",
            description="Downloads a registered checkpoint into the Keras cache "
                        "($KERAS_HOME/models/keras_vit, default ~/.keras), where "
                        "weights=NAME finds it later. KERAS_VIT_MIRROR replaces the "
                        "official host.")
    p.add_argument("name", metavar="NAME",
                   help="registered name (keras-vit models lists them; 'imagenet': the "
                        "best ImageNet-1k classifier), augreg:<filename>, or an http(s) URL")
    p.add_argument("--model", help="named model the file is for, e.g. ViTB16 (needed for "
                                   "registered names other than augreg:<filename>)")
    p.add_argument("--print-url", action="store_true",
                   help="print the URL and the exact cache path to copy the file to; "
                        "download nothing")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=cmd_download)


def _predict_parser(add):
    """The `keras-vit predict` subcommand and its flags."""
    p = add("predict", help="top-k classes of images (files or directories)")
    p.add_argument("images", nargs="+", metavar="IMAGE",
                   help="image files, or directories (their image files, recursively)")
    p.add_argument("--model", default="auto",
                   help="named model, e.g. ViTB16; 'auto' (default): the architecture the "
                        "checkpoint describes (official .npz, hf://ORG/NAME, Hub folder, "
                        ".safetensors, PyTorch file); or a .keras file")
    p.add_argument("--weights",
                   help="registered name, augreg:<file>, URL, path to an official .npz, "
                        "hf://ORG/NAME (timm / transformers), a Hub folder, .safetensors "
                        "or PyTorch file (.pth, .bin, ...)")
    p.add_argument("--weights-ema", "--ema", dest="ema", action="store_true",
                   help="with a PyTorch training checkpoint as --weights, its EMA weights "
                        "(state_dict_ema / model_ema)")
    p.add_argument("--top", type=POSITIVE_INT, default=5, help="classes per image (default 5)")
    p.add_argument("--image-size", type=POSITIVE_INT, default=None,
                   help="input resolution (default: the checkpoint's; for a .keras "
                        "model that takes any size, its position embedding's size)")
    p.add_argument("--labels", help="text file with one class name per line (default: the "
                                    "names stored in the model, else ImageNet's, else "
                                    "class_<i>)")
    p.add_argument("--outputs", default="auto", choices=["auto", "logits", "probabilities"],
                   help="what the model outputs; auto reads its head (softmax is applied "
                        "to logits)")
    p.add_argument("--skip-corrupt", action="store_true",
                   help="skip unreadable image files (listed at the end) instead of failing")
    p.add_argument("--batch-size", type=POSITIVE_INT, default=32,
                   help="images decoded, resized and classified at a time (default 32; at "
                        "most 256 MiB of float32 pixels: 445 at 224 px)")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(func=cmd_predict)


def _explain_parser(add):
    """The `keras-vit explain` subcommand and its flags."""
    p = add("explain", help="attention rollout, attention distance, position "
                            "embeddings and filters as PNG pictures")
    p.add_argument("images", nargs="+", metavar="IMAGE",
                   help="image files, or directories (their image files, recursively): "
                        "the pictures of each are named after it")
    p.add_argument("--model", default="auto",
                   help="named model (ViTB16), 'auto' (the architecture the checkpoint "
                        "describes) or a .keras file")
    p.add_argument("--weights", help="registered name, augreg:<file>, URL, .npz path, "
                                     "hf://ORG/NAME, Hub folder, .safetensors or PyTorch "
                                     "file")
    p.add_argument("--weights-ema", "--ema", dest="ema", action="store_true",
                   help="with a PyTorch training checkpoint as --weights, its EMA weights "
                        "(state_dict_ema / model_ema)")
    p.add_argument("--image-size", type=POSITIVE_INT, default=None,
                   help="input resolution in pixels (default: the checkpoint's; must "
                        "match the input size of a .keras model that has a fixed one)")
    p.add_argument("--out", required=True, type=PATH, help="folder for the PNG files")
    p.add_argument("--json", action="store_true", help="one JSON line listing the files")
    p.set_defaults(func=cmd_explain)


def _train_parser(add):
    """The `keras-vit train` subcommand and its flags."""
    p = add("train", help="train or fine-tune with a recipe; ends with a JSON line")
    p.add_argument("--model", default="ViTB16", help="named model or a .keras file")
    p.add_argument("--weights", help="registered name, augreg:<file>, path, "
                                     "hf://ORG/NAME, Hub folder, .safetensors or PyTorch "
                                     "file")
    p.add_argument("--weights-ema", action="store_true",
                   help="with a PyTorch training checkpoint as --weights, its EMA weights "
                        "(state_dict_ema / model_ema)")
    p.add_argument("--data", required=True, help="tfds:NAME, tfrecord:DIR_OR_GLOB, folder:DIR")
    p.add_argument("--recipe", default="finetune", choices=["finetune", "augreg", "scratch"],
                   help="optimizer, schedule and defaults: finetune (SGD, the paper's "
                        "fine-tuning; default), augreg (AdamW, AugReg pre-training) or "
                        "scratch (AdamW, label smoothing 0.1: small data from scratch)")
    p.add_argument("--image-size", type=POSITIVE_INT,
                   help="training resolution in pixels (default: the recipe's, 384 for "
                        "finetune, else 224; a .keras model with a fixed input size: that "
                        "size)")
    p.add_argument("--batch-size", type=POSITIVE_INT,
                   help="global batch size (default: the recipe's; clipped to the "
                        "training split)")
    p.add_argument("--steps", type=POSITIVE_INT,
                   help="length of the run in batches, all epochs together (give --steps "
                        "or --epochs; --steps alone: as many epochs as it takes)")
    p.add_argument("--epochs", type=POSITIVE_INT,
                   help="length of the run in epochs, each the training split once unless "
                        "--steps-per-epoch says otherwise (give --epochs or --steps)")
    p.add_argument("--steps-per-epoch", type=POSITIVE_INT,
                   help="batches per epoch (default: the training split once)")
    p.add_argument("--learning-rate", type=POSITIVE_FLOAT,
                   help="peak learning rate (default: the recipe's)")
    p.add_argument("--sam-rho", type=POSITIVE_FLOAT, help="train with SAM at this radius")
    p.add_argument("--lora", type=POSITIVE_INT, metavar="RANK",
                   help="LoRA fine-tuning: adapters of this rank; only they and the head "
                        "train (model.keras holds the merged model)")
    p.add_argument("--lora-targets", metavar="NAMES",
                   help="comma-separated Dense layers of each block that get adapters: "
                        "qkv, attention_output, mlp (ViT; default qkv,attention_output); "
                        "token_mixing, channel_mixing (Mixer; default both)")
    p.add_argument("--layer-decay", type=float, metavar="RATE",
                   help="layer-wise learning-rate decay in (0, 1]: block i of L trains at "
                        "RATE**(L-i) times the rate, the head at 1 (e.g. 0.65)")
    p.add_argument("--ema", type=float, nargs="?", const=_BARE_EMA, metavar="DECAY",
                   help="keep a moving average of the weights with this decay (e.g. "
                        "0.9998): validation, best.keras and model.keras use it")
    p.add_argument("--remat", action="store_true",
                   help="named models: recompute each block's activations in the backward "
                        "pass (less memory, more time)")
    p.add_argument("--precision", default="float32",
                   choices=["float32", "mixed_bfloat16", "mixed_float16"],
                   help="Keras dtype policy (default float32; mixed_bfloat16 on TPUs and "
                        "recent CPUs/GPUs)")
    p.add_argument("--jit-compile", default="auto", choices=sorted(JIT_COMPILE),
                   help="compile the training step: auto (default: XLA on GPU/TPU and "
                        "under JAX, not for TensorFlow on a CPU; torch: eager), on (XLA; "
                        "on torch, torch.compile, which recompiles for minutes), off. A "
                        "float32 run of a small model on a CPU: on measured 1.05-1.18x "
                        "faster per step for ViT-S/16")
    p.add_argument("--strategy", default="auto",
                   choices=["auto", "tpu", "multiworker", "mirrored", "default"],
                   help="TensorFlow backend: tf.distribute strategy")
    p.add_argument("--distribution", default="auto",
                   help="JAX backend (keras.distribution): auto, data, model:N (kernels "
                        "split over N devices) or none")
    p.add_argument("--coordinator", help="JAX multi-process: HOST:PORT of process 0 "
                                         "(or KERAS_DISTRIBUTION_JOB_ADDRESSES)")
    p.add_argument("--num-processes", type=POSITIVE_INT,
                   help="JAX multi-process: process count (or KERAS_DISTRIBUTION_NUM_PROCESSES)")
    p.add_argument("--process-id", type=NON_NEGATIVE_INT,
                   help="JAX multi-process: this process, 0 .. N-1 (or "
                        "KERAS_DISTRIBUTION_PROCESS_ID)")
    p.add_argument("--gradient-accumulation-steps", type=POSITIVE_INT,
                   help="batches per optimizer update (a larger effective batch)")
    p.add_argument("--preset", help="keras_vit.data preset (default: the recipe's)")
    p.add_argument("--train-split", default="train", help="split to train on (default train)")
    p.add_argument("--val-split", default=None,
                   help="default: 'validation' when the data has it, else 'test' (a folder: "
                        "its --holdout)")
    p.add_argument("--holdout", type=FRACTION, default=None,
                   help="fraction of a folder held out for validation/test (default 0.1)")
    p.add_argument("--skip-corrupt", action="store_true",
                   help="skip corrupt image files instead of failing")
    p.add_argument("--data-dir", help="TFDS data directory")
    p.add_argument("--seed", type=SEED, default=0,
                   help="seed of the initialisation, shuffling and augmentation (default 0)")
    p.add_argument("--out", default="runs/keras_vit", type=PATH,
                   help="run directory; a killed run resumes when the same command runs "
                        "again; a folder holding another or a finished run is refused")
    p.add_argument("--overwrite", action="store_true",
                   help="remove the run files in --out and start afresh")
    p.add_argument("--no-memory-check", action="store_true",
                   help="train even where the step's estimated memory is more than the CPU "
                        "machine has available (swap; checked by default: the OOM killer "
                        "would end the run without a message)")
    p.add_argument("--quiet", action="store_true", help="one log line per epoch")
    p.add_argument("--json", action="store_true",
                   help="stdout: only the results' JSON line (progress goes to stderr)")
    p.set_defaults(func=cmd_train)


def _evaluate_parser(add):
    """The `keras-vit evaluate` subcommand and its flags."""
    p = add("evaluate", help="accuracy of a saved model; one JSON line",
            description="Accuracy and cross-entropy of a saved model on a split of a data "
                        "source, as one JSON line. Its cross_entropy has no label "
                        "smoothing, unlike train's val_loss (the training loss, with the "
                        "recipe's label smoothing): the two differ.")
    p.add_argument("model_path", metavar="MODEL.keras",
                   help="the .keras model to evaluate (e.g. a run's model.keras)")
    p.add_argument("--data", required=True,
                   help="tfds:NAME, tfrecord:DIR_OR_GLOB or folder:DIR (its class names "
                        "must be the model's)")
    p.add_argument("--split", default=None,
                   help="default: 'validation' when the data has it, else 'test'")
    p.add_argument("--holdout", type=FRACTION, default=None,
                   help="fraction of a folder held out (default 0.1, as in train)")
    p.add_argument("--skip-corrupt", action="store_true",
                   help="skip corrupt image files instead of failing")
    p.add_argument("--image-size", type=POSITIVE_INT,
                   help="resolution in pixels (default: the model's input size)")
    p.add_argument("--batch-size", type=POSITIVE_INT, default=64,
                   help="images per batch (default 64)")
    p.add_argument("--data-dir", help="TFDS data directory")
    p.add_argument("--json", action="store_true",
                   help="one JSON line (the output is always JSON)")
    p.set_defaults(func=cmd_evaluate)


def _export_parser(add):
    """The `keras-vit export` subcommand and its flags."""
    p = add("export", help="SavedModel, TFLite, ONNX, OpenVINO or a Hub folder for timm / "
                           "transformers, verified against Keras",
            description="Exports a saved model, runs the export on a sample of images and "
                        "compares it with Keras. It prints its report (one JSON line with "
                        "--json); an export that misses its bar is moved to "
                        "<out>.rejected, its report printed all the same, and the command "
                        "exits with status 2 (--no-check keeps it).")
    p.add_argument("model_path", metavar="MODEL.keras", help="the .keras model to export")
    p.add_argument("--format", required=True,
                   choices=["saved_model", "tflite", "onnx", "openvino", *HUB_FORMATS],
                   help="timm, transformers: a Hugging Face Hub folder (config.json + "
                        "model.safetensors) that timm.create_model('local-dir:DIR', "
                        "pretrained=True) or ViTForImageClassification.from_pretrained(DIR) "
                        "opens")
    p.add_argument("--quantize", default="none", choices=["none", "float16", "dynamic", "int8"],
                   help="weight quantization (default none). --format tflite: none, "
                        "float16, dynamic or int8; onnx: none, dynamic or int8; openvino: "
                        "none or float16; int8 (tflite, onnx) calibrates on --calibration")
    p.add_argument("--opset", type=POSITIVE_INT, default=None,
                   help="ONNX opset (default: tf2onnx's, 15)")
    p.add_argument("--calibration", help="int8 calibration images: a data source "
                                         "(folder:DIR, tfrecord:..., tfds:...)")
    p.add_argument("--calibration-split", default=None,
                   help="split of --calibration to calibrate on (default train)")
    p.add_argument("--calibration-samples", type=POSITIVE_INT, default=None,
                   help="calibration images (default 500)")
    p.add_argument("--validation", help="images to verify on: a data source (default: "
                                        "the calibration source, else random pixels)")
    p.add_argument("--validation-split", default=None,
                   help="default: 'validation' when the data has it, else 'test'")
    p.add_argument("--validation-samples", type=POSITIVE_INT, default=None,
                   help="images to verify on (default 2000)")
    p.add_argument("--holdout", type=FRACTION, default=None,
                   help="fraction of a folder without split subfolders held out for "
                        "verification (default 0.1, as in train)")
    p.add_argument("--skip-corrupt", action="store_true",
                   help="leave image files that do not decode out of the samples "
                        "(counted in the report) instead of failing")
    p.add_argument("--batch-size", type=POSITIVE_INT, default=1, help="static TFLite batch")
    p.add_argument("--resize", action="store_true",
                   help="SavedModel: accept uint8 images of any size")
    p.add_argument("--top-k", type=POSITIVE_INT, default=5, help="SavedModel: top_k outputs")
    p.add_argument("--outputs", default="auto", choices=["auto", "logits", "probabilities"],
                   help="what the model outputs (auto reads its head)")
    p.add_argument("--no-check", action="store_true",
                   help="keep an export that misses its accuracy bar")
    p.add_argument("--no-metadata", action="store_true",
                   help="TFLite: no TFLite Metadata (input normalization, labels inside) "
                        "in the file; MediaPipe's ImageClassifier needs it")
    p.add_argument("--out", required=True, type=PATH,
                   help="SavedModel directory, .tflite, .onnx or OpenVINO .xml file, or the "
                        "Hub folder (timm, transformers)")
    p.add_argument("--json", action="store_true", help="the report as one JSON line")
    p.set_defaults(func=cmd_export)


def _quickstart_parser(add):
    """The `keras-vit quickstart` subcommand and its flags."""
    p = add("quickstart", help="train a small ViT on the digits (offline)")
    p.add_argument("--out", default="runs/quickstart", type=PATH,
                   help="run folder: the digits, model.keras, the logs and the TFLite file "
                        "(default runs/quickstart); a folder holding a finished quickstart "
                        "is refused (give --overwrite or another --out), a killed one resumes")
    p.add_argument("--overwrite", action="store_true",
                   help="remove the last run's files in --out (model.keras, best.keras, logs; "
                        "not the digits) and train afresh")
    p.add_argument("--epochs", type=POSITIVE_INT, default=40,
                   help="training epochs (default 40: the README's number)")
    p.add_argument("--no-export", action="store_true", help="skip the TFLite export")
    p.add_argument("--json", action="store_true",
                   help="stdout: only the results' JSON line (progress goes to stderr)")
    p.set_defaults(func=cmd_quickstart)

def main(argv=None, out=None):
    """Runs the command; returns its exit status (0; 2 for an error; 1 for a
    diverged training run or an internal error)."""
    args = build_parser().parse_args(argv)
    _console.quiet(verbose=args.verbose)
    with _console.line_tracking():  # an error after a progress bar: on a line of its own
        return _run(args, out or sys.stdout)


def _run(args, out):
    """`args.func(args, out)` with TensorFlow's native lines filtered out;
    an exception becomes one line and an exit status (see `main`)."""
    try:
        # TensorFlow's C++ log lines (fd 2) are dropped for the whole command.
        with _console.filtered_stderr():
            return args.func(args, out)
    except BrokenPipeError:  # `keras-vit models | head`
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        if args.debug:
            raise
        _console.print_error("interrupted.")
        return 130
    except Exception as error:  # noqa: BLE001 - every error is one line
        if args.debug:
            raise
        found = _console.error_message(error)
        if found is None:  # a bug: say where to look
            _console.print_error(
                f"{type(error).__name__}: {_console._one_line(error) or 'unexpected error'} "
                "(an internal error: run again with --debug for the traceback)")
            return 1
        _console.print_error(found[0])
        return found[1]


if __name__ == "__main__":
    sys.exit(main())
