"""LoRA against full fine-tuning on real data: the quickstart's ViT trained
from scratch on the digits 0-4, then fine-tuned on the digits 5-9 (a new
5-class head), fully (with and without layer-wise learning-rate decay) and
with LoRA adapters (`keras-vit train --lora RANK`). Each row: test accuracy
on the held-out 5-9 digits, trainable weights as a fraction of the model,
and seconds, all through `keras_vit.training.train` (the `scratch` recipe,
the same epochs, seed 0).

    python benchmarks/lora.py --json

Writes its folders under `runs/bench_lora` (`--out`). The last line is one
JSON object; it records the CPU. About 3 minutes on 2 cores.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from machine import cpu  # noqa: E402  (the same CPU record as the README's)

PRETRAIN_DIGITS, FINETUNE_DIGITS = "01234", "56789"
# (row name, train() arguments beyond the common ones)
RUNS = (
    ("full fine-tuning", {}),
    ("full, layer decay 0.75", {"layer_decay": 0.75}),
    ("LoRA rank 4 (qkv, attention_output)", {"lora_rank": 4}),
    ("LoRA rank 8 (+ mlp)", {"lora_rank": 8, "lora_targets": ("qkv", "attention_output",
                                                              "mlp")}),
    ("LoRA rank 8 (+ mlp), learning rate x5", {"lora_rank": 8, "learning_rate": 1e-2,
                                               "lora_targets": ("qkv", "attention_output",
                                                                "mlp")}),
)


def subset(digits_root, root, digits):
    """`root/{train,test}/<d>` links to the digits `digits` of the quickstart's folder."""
    for split in ("train", "test"):
        os.makedirs(root / split, exist_ok=True)
        for d in digits:
            link = root / split / d
            if not link.exists():
                os.symlink(os.path.abspath(digits_root / split / d), link)
    return f"folder:{root}"


def transplanted(pretrained, classes):
    """The pretrained model with a new zero-initialised `classes`-way head."""
    import keras_vit
    from keras_vit.training.quickstart import QUICKSTART_MODEL

    model = keras_vit.VisionTransformer(**QUICKSTART_MODEL, input_shape=(32, 32, 3),
                                        classes=classes, classifier_activation=None,
                                        name="quickstart_vit")
    for layer in model.layers:
        if layer.name != "head" and layer.weights:
            layer.set_weights(pretrained.get_layer(layer.name).get_weights())
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/bench_lora")
    parser.add_argument("--pretrain-epochs", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="only the JSON line on stdout")
    args = parser.parse_args(argv)
    import keras

    import keras_vit
    from keras_vit.training import train
    from keras_vit.training.quickstart import QUICKSTART_MODEL, write_digits

    out = pathlib.Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    write_digits(str(out / "digits"))
    common = dict(recipe="scratch", image_size=32, batch_size=64, preset="digits",
                  strategy="default", cache=True, verbose=0, seed=0, overwrite=True)
    keras.utils.set_random_seed(0)
    base = keras_vit.VisionTransformer(**QUICKSTART_MODEL, input_shape=(32, 32, 3), classes=5,
                                       classifier_activation=None, name="quickstart_vit")
    start = time.perf_counter()
    pre = train(base, subset(out / "digits", out / "pre", PRETRAIN_DIGITS),
                out=str(out / "pretrain"), epochs=args.pretrain_epochs, **common)
    pretrained = keras.saving.load_model(pre["model"])
    data = subset(out / "digits", out / "ft", FINETUNE_DIGITS)
    rows = []
    for index, (name, extra) in enumerate(RUNS):
        keras.utils.set_random_seed(0)
        model = transplanted(pretrained, 5)
        began = time.perf_counter()
        results = train(model, data, out=str(out / f"finetune_{index}"),
                        epochs=args.epochs, **common, **extra)
        rows.append({"run": name, "test_accuracy": round(results["val_accuracy"], 4),
                     "trainable_parameters": results["trainable_parameters"],
                     "parameters": results["parameters"],
                     "trainable_fraction": round(results["trainable_parameters"]
                                                 / results["parameters"], 4),
                     "seconds": round(time.perf_counter() - began, 1)})
        if not args.json:
            print(rows[-1], file=sys.stderr, flush=True)
    numbers = {
        "command": "python benchmarks/lora.py --json", "cpu": cpu(),
        "date": datetime.date.today().isoformat(), "python": platform.python_version(),
        "keras": keras.__version__, "backend": keras.backend.backend(),
        "pretrain": {"digits": PRETRAIN_DIGITS, "epochs": args.pretrain_epochs,
                     "test_accuracy": round(pre["val_accuracy"], 4),
                     "seconds": round(time.perf_counter() - start, 1)},
        "finetune": {"digits": FINETUNE_DIGITS, "epochs": args.epochs,
                     "train_images": results["data"]["train"]["images"],
                     "test_images": results["data"]["validation"]["images"]},
        "rows": rows}
    print(json.dumps(numbers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
