"""The `keras-vit` command.

    keras-vit [--verbose] [--debug] COMMAND ...
    keras-vit models [--json]
    keras-vit download NAME [--model ViTB16] [--print-url] [--json]
    keras-vit predict IMAGE_OR_DIR... --model ViTB16|auto|MODEL.keras
                     [--weights NAME_OR_PATH] [--top 5] [--image-size S] [--labels FILE]
                     [--outputs auto|logits|probabilities]
                     [--skip-corrupt] [--batch-size 32] [--json]
    keras-vit explain IMAGE... --model auto --weights CKPT.npz --out DIR [--class NAME]
                     [--json]
    keras-vit train --model ViTB16 --weights imagenet21k --data tfds:cifar10 ... [--json]
    keras-vit evaluate MODEL.keras --data SOURCE [--split S] [--skip-corrupt] [--plot DIR]
                      [--json]
    keras-vit plot RUN_DIR [--out FILE] [--json]
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

import contextlib
import os
import pathlib
import sys

import keras_vit  # light here: `keras_vit_cli` makes it load its names on first use
from keras_vit import _checks, _cli_parser, _console
from keras_vit._cli_parser import BARE_EMA, EXPORT_QUANTIZE, HUB_FORMATS, JIT_COMPILE
from keras_vit._image_files import image_paths_and_left_out
from keras_vit._saving import check_keras_path as _check_model_file
from keras_vit._saving import load_keras_model
from keras_vit.errors import TrainingDivergedError
from keras_vit.model_arguments import check_model_arguments, check_model_name
from keras_vit.training import curves, quickstart
from keras_vit.training.precision import compute_policy, warn_if_emulated
from keras_vit.variants import (
    ALL_VARIANTS,
    OFFICIAL,
    effective_patch_size,
    unknown_model_message,
)
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
            "release": v.release,
            "image_size": v.image_size,
            "hub": list(v.hub),
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
    for row in [r for r in variants if r["release"] == OFFICIAL]:
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
    print("\nModels with Hugging Face Hub weights (weights='hf://ORG/NAME', a Hub folder "
          "or a file; no registered names):", file=out)
    print(f"  {'function':<16} {'variant':<17} {'patch':>5} {'hidden':>6} {'layers':>6} "
          f"{'heads':>5} {'mlp':>5} {'size':>4}  Hub repositories", file=out)
    for row in [r for r in variants if r["release"] != OFFICIAL]:
        c = row["config"]
        print(f"  {row['function']:<16} {row['variant']:<17} {c['patch_size']:>5} "
              f"{c['hidden_size']:>6} {c['num_layers']:>6} {c['num_heads']:>5} "
              f"{c['mlp_dim']:>5} {row['image_size']:>4}  {', '.join(row['hub'])}", file=out)
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
    raise ValueError(unknown_model_message(model, "--model"))


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
        if variant.release != OFFICIAL:
            raise ValueError(
                f"{variant.function} has no registered weights: its checkpoints are on the "
                f"Hugging Face Hub ({', '.join(variant.hub)}), which predict and train "
                f"download themselves, e.g. --weights hf://{variant.hub[0]}.")
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


def _check_model_args(args):
    """Validates `--model` / `--weights` without importing TensorFlow."""
    check_model_arguments(args.model, args.weights, args.ema,
                          getattr(args, "images", None) or (), flags=True)


def _model_from_args(args):
    """The model of `--model` / `--weights` / `--image-size` (predict, explain)."""
    _check_model_args(args)
    _keras()
    from keras_vit.prediction import build_model  # heavy (see the top)

    return build_model(args.model, args.weights, args.ema, args.image_size, flags=True)


def cmd_predict(args, out):
    _checks.positive_int(args.top, "--top")  # (argparse checked it; a Namespace of a caller)
    check_model_name(args.model, flags=True)  # a mistyped name: before any work
    paths, left_out = image_paths_and_left_out(args.images)
    _check_model_args(args)
    for sentence in left_out:  # image types keras_vit does not read: counted, never silent
        print(f"{_console.PROG}: {sentence}", file=sys.stderr)
    model = _model_from_args(args)
    warn_if_emulated(compute_policy(model))
    from keras_vit.prediction import predict_images  # heavy (see the top)

    results, skipped, size = predict_images(
        model, paths, top=args.top, labels=args.labels, outputs=args.outputs,
        image_size=args.image_size, batch_size=args.batch_size,
        skip_corrupt=args.skip_corrupt, flags=True)
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
    check_model_name(args.model, flags=True)  # a mistyped name: before any work
    paths, left_out = image_paths_and_left_out(args.images)
    _check_model_args(args)
    for sentence in left_out:  # image types keras_vit does not read: counted, never silent
        print(f"{_console.PROG}: {sentence}", file=sys.stderr)
    _console.load_tensorflow()  # quietly, before keras_vit.prediction imports it
    from keras_vit.prediction import read_images, resize_images  # heavy (see the top)

    images, _, _ = read_images(paths, flags=True)
    model = _model_from_args(args)
    from keras_vit.inspect.analysis import input_size, stored_image_size  # heavy (see the top)
    from keras_vit.inspect.plots import classify, explain  # heavy (see the top)

    input_size(model, args.image_size, "--image-size")
    size = stored_image_size(model)  # a model taking any size: its stored grid
    names = [pathlib.Path(p).stem for p in paths]
    resized = resize_images(images, size)
    predictions = classify(model, resized, args.class_name, "--class")
    written = explain(model, resized, args.out, names=names, class_name=args.class_name,
                      predictions=predictions)
    rows = None if predictions is None else [
        {"image": path, **row} for path, row in zip(paths, predictions, strict=True)]
    if args.json:
        print(_console.json_dumps({"out": args.out, "image_size": list(size), "pictures": written,
                                   "predictions": rows}), file=out)
        return 0
    for row in rows or ():
        top, explained = row["predicted"], row["explained"]
        print(f"{row['image']}: predicted {top['class']} ({top['probability']:.1%})"
              + (f"; relevance drawn for {explained['class']} ({explained['probability']:.1%})"
                 if explained else ""), file=out)
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
    """Keras' `verbose` for `fit` by `_console.progress_verbosity`'s rule
    (the live bar on a terminal, one line per epoch to a file or pipe),
    read on the stream the progress goes to (stderr with --json); --quiet:
    one line per epoch."""
    return _console.progress_verbosity(2 if args.quiet else 1,
                                       sys.stderr if args.json else sys.stdout)


def cmd_train(args, out):
    if args.ema is BARE_EMA:
        raise ValueError("--ema takes a decay in (0, 1), e.g. --ema 0.9998 (a moving "
                         "average of the weights while training); a PyTorch checkpoint's "
                         "EMA weights are --weights-ema.")
    if args.model.endswith((".keras", ".npz")) or os.path.splitext(args.model)[1]:
        _check_model_file(args.model, "--model")
    elif args.model == "auto" and args.weights is None:
        raise ValueError("--model auto builds the model a checkpoint describes; give the "
                         "checkpoint as --weights.")
    elif args.model != "auto" and args.model not in ALL_VARIANTS:  # before the data is listed
        raise ValueError(unknown_model_message(args.model, "--model",
                                               ", 'auto' or a .keras file"))
    _keras()
    from keras_vit.training import train  # heavy (see the top)

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
                       data_dir=args.data_dir, plot=args.plot, **extra)
    if args.json:
        print(_console.json_dumps(results), file=out)
        return 0
    from keras_vit.training.report import format_report  # heavy (see the top)

    print(format_report(results, f"{results['model']} on {results['data']}, split "
                                 f"{results['split']!r}:"), file=out)
    if results["plot"]:
        print(f"\nconfusion matrix picture: {results['plot']}", file=out)
    return 0


def cmd_plot(args, out):
    drawn = curves.plot_run(args.run_dir, args.out)
    if args.json:
        print(_console.json_dumps(drawn), file=out)
        return 0
    best = ("" if drawn["best_epoch"] is None else
            f"; best epoch {drawn['best_epoch']}, val_accuracy "
            f"{drawn['best_val_accuracy']:.4f}")
    print(f"{drawn['curves']} ({_console.plural(drawn['epochs'], 'epoch')} of "
          f"{drawn['log']}{best})", file=out)
    return 0


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
    if args.image_size is not None and args.format in HUB_FORMATS:
        raise ValueError(f"--image-size applies to --format saved_model, tflite, onnx or "
                         f"openvino; a {args.format} folder is written at the size of the "
                         "model's position embedding.")
    if args.no_metadata and args.format != "tflite":
        raise ValueError(f"--no-metadata applies to --format tflite; not to --format "
                         f"{args.format}.")
    model = _load_keras_model(args.model_path)
    from keras_vit import export  # heavy (see the top)

    if args.format == "tflite":  # named as the flag, before any sampling
        from keras_vit.export.batches import check_batch_size  # heavy (see the top)
        from keras_vit.export.model import export_image_size  # heavy (see the top)

        check_batch_size(args.batch_size, export_image_size(model, args.image_size),
                         "--batch-size")

    sized = {} if args.format in HUB_FORMATS else {"image_size": args.image_size}
    common = dict(outputs=args.outputs, validation_data=args.validation, **sized,
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


def build_parser():
    """The `keras-vit` parser (`keras_vit._cli_parser`), each command's
    `func` the `cmd_` function of this module."""
    return _cli_parser.build_parser({
        "models": cmd_models, "download": cmd_download, "predict": cmd_predict,
        "explain": cmd_explain, "train": cmd_train, "evaluate": cmd_evaluate,
        "plot": cmd_plot, "export": cmd_export, "quickstart": cmd_quickstart})


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
