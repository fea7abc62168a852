"""The `keras-vit` command's parser: its flags, their help and their
argparse types (the `keras_vit._checks` sentences). `keras_vit.cli` runs
the commands; this module imports nothing heavy (`keras-vit --help`)."""

import argparse

from keras_vit import _checks

# --jit-compile values: train's jit_compile.
JIT_COMPILE = {"auto": "auto", "on": True, "off": False}


# --quantize values each export --format takes.
EXPORT_QUANTIZE = {"saved_model": ("none",), "tflite": ("none", "float16", "dynamic", "int8"),
                   "onnx": ("none", "dynamic", "int8"), "openvino": ("none", "float16"),
                   "timm": ("none",), "transformers": ("none",)}
# The formats that write a Hugging Face Hub folder (`export.to_hub_folder`).
HUB_FORMATS = ("timm", "transformers")


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
BARE_EMA = object()
POSITIVE_INT = _checked(_checks.positive_int, int)
NON_NEGATIVE_INT = _checked(_checks.non_negative_int, int)
SEED = _checked(_checks.seed, int)
POSITIVE_FLOAT = _checked(_checks.positive_float, float)
FRACTION = _checked(_checks.fraction, float)


class _Renamed(argparse.Action):
    """A flag's old spelling, kept only to say its new name in one line
    (one meaning per flag: `--ema DECAY` is train's weight average)."""

    def __init__(self, option_strings, dest, message, **kwargs):
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, help=argparse.SUPPRESS)
        self.message = message

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(self.message)


# predict's and explain's `--ema` (once the spelling of --weights-ema).
EMA_RENAMED = ("--ema is train's weight average (keras-vit train --ema DECAY); a PyTorch "
               "training checkpoint's EMA weights are --weights-ema")


class _Parser(argparse.ArgumentParser):
    """argparse with the command's one-line errors (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(commands):
    """The `keras-vit` parser: the global flags (before or after the
    command) and one subparser per command; `commands`: {name: the
    function `main` runs, `func(args, out)`}."""
    parser = _Parser(
        prog="keras-vit", parents=[_global_flags(True)],
        description="Vision Transformers / MLP-Mixers with the official checkpoints.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="keras-vit COMMAND --help shows its options")
    flags = _global_flags(False)

    def add(name, **kw):
        kw.setdefault("description", kw["help"][0].upper() + kw["help"][1:] + ".")
        p = sub.add_parser(name, parents=[flags], **kw)
        p.set_defaults(func=commands[name])
        return p

    for add_command in (_models_parser, _download_parser, _predict_parser, _explain_parser,
                        _train_parser, _evaluate_parser, _plot_parser, _export_parser,
                        _quickstart_parser):
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
    p.add_argument("--weights-ema", dest="ema", action="store_true",
                   help="with a PyTorch training checkpoint as --weights, its EMA weights "
                        "(state_dict_ema / model_ema)")
    p.add_argument("--ema", action=_Renamed, message=EMA_RENAMED)
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


def _explain_parser(add):
    """The `keras-vit explain` subcommand and its flags."""
    p = add("explain", help="attention rollout (titled with the predicted class), a "
                            "class's relevance, attention distance, position embeddings "
                            "and filters as PNG pictures")
    p.add_argument("images", nargs="+", metavar="IMAGE",
                   help="image files, or directories (their image files, recursively): "
                        "the pictures of each are named after it")
    p.add_argument("--model", default="auto",
                   help="named model (ViTB16), 'auto' (the architecture the checkpoint "
                        "describes) or a .keras file")
    p.add_argument("--weights", help="registered name, augreg:<file>, URL, .npz path, "
                                     "hf://ORG/NAME, Hub folder, .safetensors or PyTorch "
                                     "file")
    p.add_argument("--weights-ema", dest="ema", action="store_true",
                   help="with a PyTorch training checkpoint as --weights, its EMA weights "
                        "(state_dict_ema / model_ema)")
    p.add_argument("--ema", action=_Renamed, message=EMA_RENAMED)
    p.add_argument("--image-size", type=POSITIVE_INT, default=None,
                   help="input resolution in pixels (default: the checkpoint's; must "
                        "match the input size of a .keras model that has a fixed one)")
    p.add_argument("--class", dest="class_name", metavar="NAME",
                   help="draw this class's relevance (gradient-weighted attention rollout) "
                        "on each rollout picture instead of the attention rollout, which is "
                        "the same for every class (default: the rollout, titled with the "
                        "predicted class)")
    p.add_argument("--out", required=True, type=PATH, help="folder for the PNG files")
    p.add_argument("--json", action="store_true",
                   help="one JSON line: the files and each image's predicted class")


def _train_parser(add):
    """The `keras-vit train` subcommand and its flags."""
    p = add("train", help="train or fine-tune with a recipe; ends with a JSON line")
    p.add_argument("--model", default="ViTB16",
                   help="named model, 'auto' (the model --weights describes: a timm or "
                        "transformers folder, hf://ORG/NAME, an official .npz) or a .keras "
                        "file")
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
    _fine_tuning_flags(p)
    _compute_flags(p)
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


def _fine_tuning_flags(p):
    """train's SAM, LoRA, layer decay, EMA and remat flags."""
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
    p.add_argument("--ema", type=float, nargs="?", const=BARE_EMA, metavar="DECAY",
                   help="keep a moving average of the weights with this decay (e.g. "
                        "0.9998): validation, best.keras and model.keras use it")
    p.add_argument("--remat", action="store_true",
                   help="named models: recompute each block's activations in the backward "
                        "pass (less memory, more time)")


def _compute_flags(p):
    """train's precision, compilation and distribution flags."""
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


def _evaluate_parser(add):
    """The `keras-vit evaluate` subcommand and its flags."""
    p = add("evaluate", help="top-1/top-5 accuracy, per-class results and the confusion "
                             "matrix of a saved model",
            description="The classification report of a saved model on a split of a data "
                        "source: top-1 and (more than 5 classes) top-5 accuracy, each "
                        "class's precision, recall (its accuracy) and F1 with its image "
                        "counts, the classes mixed up most and the confusion matrix (rows: "
                        "true class), as a table, or one JSON line with --json. Its "
                        "cross_entropy has no label smoothing, unlike train's val_loss (the "
                        "training loss, with the recipe's label smoothing): the two differ.")
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
    p.add_argument("--plot", type=PATH, metavar="DIR",
                   help="write DIR/confusion_matrix.png (scikit-learn and matplotlib: pip "
                        "install \"keras-vision-transformer[plots]\")")
    p.add_argument("--json", action="store_true", help="one JSON line instead of the table")


def _plot_parser(add):
    """The `keras-vit plot` subcommand and its flags."""
    p = add("plot", help="draw a run's training curves (curves.png) from its log.csv",
            description="Draws RUN_DIR/curves.png from the run folder's log.csv: the loss "
                        "and the accuracy per epoch, training and validation, the best "
                        "epoch (highest val_accuracy, as best.keras) marked. train draws it "
                        "at the end of every run; this draws it again for a run still going "
                        "or resumed. Imports no TensorFlow; needs matplotlib (pip install "
                        "\"keras-vision-transformer[plots]\").")
    p.add_argument("run_dir", metavar="RUN_DIR", type=PATH,
                   help="the run folder (train's --out)")
    p.add_argument("--out", type=PATH, metavar="FILE",
                   help="where to write the PNG (default RUN_DIR/curves.png)")
    p.add_argument("--json", action="store_true",
                   help="one JSON line: the file written, the epochs, the best epoch")


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
    p.add_argument("--image-size", type=POSITIVE_INT, default=None,
                   help="a model that takes any size: the size it is verified at, TFLite's "
                        "one size (default: its position embedding's size); SavedModel, "
                        "ONNX and OpenVINO keep any size and are verified at two others too")
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
