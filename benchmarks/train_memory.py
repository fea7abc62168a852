"""The host memory of `keras_vit.training.train`'s step, measured against
the estimate that `keras_vit.training.memory` refuses a run by.

    python benchmarks/train_memory.py [--configs ViTTi16@384 ViTS16@224 ...]
        [--batches 4 8] [--json docs/performance/train_memory.json]

Each configuration (`MODEL@SIZE`, `+remat` for rematerialised blocks;
MODEL a named model or one of `FAMILY_MODELS`, the later families' options
on ViT-S at patch 14 or 16: `--configs DINOv2S14@224 ViTS14@224`) runs
`train` (the finetune recipe, SGD with momentum; 2 steps and the
validation pass, on a folder of scikit-learn's digits) in a fresh process
at each batch size, and reads its peak resident memory (`ru_maxrss`) after
the imports and after training. The measured bytes per image are the
slope between the two batches, the measured fixed part the rest above the
imports' peak; beside them, the estimate's (`estimate_training_memory`).
An estimate above the measurement refuses a run that would have fitted,
one below lets a run be killed: the ratio is the number to look at. Prints
one line per configuration (with the Keras backend, `KERAS_BACKEND`) and
the CPU; `--json` writes them.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from machine import cpu  # noqa: E402  (the same CPU record as the README's)

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_CONFIGS = ["ViTTi16@384", "ViTTi16@384+remat", "ViTS16@224", "MixerS16@224",
                   "R26ViTS32@224"]
# `keras_vit.VisionTransformer` options of models that have no named builder:
# ViT-S at patch 14 without and with DINOv2's LayerScale, with DINOv2-g's
# SwiGLU MLP (its width after the gating ViT-S's), and SigLIP's
# attention-pooling head on ViT-S/16.
_S = dict(hidden_size=384, num_layers=12, num_heads=6, mlp_dim=1536)
FAMILY_MODELS = {
    "ViTS14": dict(_S, patch_size=14),
    "DINOv2S14": dict(_S, patch_size=14, layer_scale_init=1e-5),
    "SwiGLUS14": dict(_S, patch_size=14, mlp="swiglu"),
    "SigLIPS16": dict(_S, patch_size=16, classifier="map"),
    # #50: RoPE alone (against ViTS16), and the DINOv3, EVA-02 and BEiT option sets
    "RoPES16": dict(_S, patch_size=16, rope="dinov3"),
    "DINOv3S16": dict(_S, patch_size=16, rope="dinov3", position_embedding=False,
                      num_register_tokens=4, layer_scale_init=1e-5, classifier="avg"),
    "EVA02S16": dict(_S, patch_size=16, rope={"variant": "eva", "ref_grid": (14, 14)},
                     mlp="swiglu", mlp_norm=True, qkv_bias="qv", classifier="avg",
                     fc_norm=True),
    "BEiTS16": dict(_S, patch_size=16, relative_position_bias=True, qkv_bias="qv",
                    position_embedding=False, layer_scale_init=0.1, classifier="avg",
                    fc_norm=True),
}

CHILD = textwrap.dedent("""
    import json, os, resource, sys
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, {root!r})
    import keras
    import keras_vit
    from keras_vit.training import memory
    from keras_vit.training.trainer import train

    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    imports = peak()
    family = {family!r}
    build = (getattr(keras_vit, {model!r}) if family is None
             else lambda **kw: keras_vit.VisionTransformer(**family, **kw))
    model = build(weights=None, input_shape=({size}, {size}, 3), classes=10, remat={remat})
    estimate = memory.estimate_training_memory(model, {batch}, optimizer_slots=1)
    train(model, "folder:" + {data!r}, recipe="finetune", out={out!r}, image_size={size},
          batch_size={batch}, steps=2, verbose=0, overwrite=True)
    print(json.dumps({{"backend": keras.backend.backend(), "imports": imports,
                      "peak": peak(), "estimated_per_image": estimate.per_image,
                      "estimated_fixed": estimate.fixed}}))
""")


def measure(config, batch, data, out):
    model, _, rest = config.partition("@")
    size, _, flag = rest.partition("+")
    code = CHILD.format(root=str(ROOT), model=model, family=FAMILY_MODELS.get(model),
                        size=int(size), remat=flag == "remat", batch=batch, data=data, out=out)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{config} batch {batch} failed (exit {result.returncode}):\n"
                         f"{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS)
    parser.add_argument("--batches", nargs=2, type=int, default=[4, 8])
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    small, large = sorted(args.batches)
    machine = cpu()
    print(f"CPU: {machine['model']} ({machine['cores']} cores)", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        from keras_vit.training.quickstart import write_digits

        data = os.path.join(tmp, "digits")
        write_digits(data)
        for config in args.configs:
            a = measure(config, small, data, os.path.join(tmp, "a"))
            b = measure(config, large, data, os.path.join(tmp, "b"))
            per_image = (b["peak"] - a["peak"]) / (large - small)
            fixed = a["peak"] - a["imports"] - small * per_image
            row = {"config": config, "backend": a["backend"], "batches": [small, large],
                   "peak_bytes": [a["peak"], b["peak"]], "imports_bytes": a["imports"],
                   "measured_per_image": per_image, "estimated_per_image":
                       a["estimated_per_image"],
                   "measured_fixed": fixed, "estimated_fixed": a["estimated_fixed"],
                   "estimate_over_measured_per_image":
                       a["estimated_per_image"] / per_image if per_image > 0 else None}
            rows.append(row)
            ratio = row["estimate_over_measured_per_image"]
            print(f"{config:20s} {a['backend']:10s} per image: measured "
                  f"{per_image / 1e6:7.1f} MB, estimated "
                  f"{a['estimated_per_image'] / 1e6:7.1f} MB"
                  + (f" ({ratio:.2f}x)" if ratio else "")
                  + f"; fixed: measured {fixed / 1e6:6.0f} MB, estimated "
                  f"{a['estimated_fixed'] / 1e6:6.0f} MB", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": machine, "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
