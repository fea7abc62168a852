"""The `weights=` path, walked: how often each checkpoint file is opened
and read, and which keras_vit functions the path passes through.

For each kind of source (an official `.npz` through a builder and through
`model_from_checkpoint`, a Keras `.weights.h5`, a Hub folder, a bare
`.safetensors` file, and a `.pth` written by torch when torch is
installed), one warm-up call, then one measured call:

- `opens`: `open` audit events (`sys.addaudithook`) for a path inside the
  checkpoint, plus `h5py.File` calls on it (h5py opens files in C, without
  an audit event);
- `reads`: bytes the process read (`rchar` of `/proc/self/io`) during the
  call, divided by the checkpoint's size: 1.0 is every byte read once;
- `stops`: distinct functions and methods of `keras_vit.weights` /
  `keras_vit.models` entered (`sys.setprofile`; lambdas, comprehensions
  and generated `__init__`s aside), and the modules they are in.

    python benchmarks/weights_path.py [--json]

The tiny official and Hub fixtures of `tests/fixtures/` are the checkpoints.
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import h5py  # noqa: E402
import keras  # noqa: E402

import keras_vit  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
OFFICIAL = dict(patch_size=4, hidden_size=48, num_layers=2, num_heads=3, mlp_dim=96)
TIMM = dict(patch_size=8, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64,
            input_shape=(32, 32, 3))


def _rchar():
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def _size(path):
    path = pathlib.Path(path)
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


_WATCHED = {}  # the checkpoint being walked: {"root": path, "opens": [...]}


def _audit(event, args):
    root = _WATCHED.get("root")
    if root and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if path == root or path.startswith(root + os.sep):
            _WATCHED["opens"].append(os.path.relpath(path, os.path.dirname(root)))


def walk(call, checkpoint):
    """`call()` once as a warm-up, then measured: opens, reads, stops."""
    call()
    keras.backend.clear_session()
    stops = set()

    def profile(frame, event, arg):
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.startswith(("keras_vit.weights", "keras_vit.models")) \
                    and "<" not in frame.f_code.co_qualname:  # no lambdas, comprehensions
                stops.add((module, frame.f_code.co_qualname))

    _WATCHED.update(root=os.path.realpath(checkpoint), opens=[])
    h5_file = h5py.File

    def counted_h5(name, *args, **kwargs):
        _audit("open", (name,))
        return h5_file(name, *args, **kwargs)

    h5py.File = counted_h5
    before = _rchar()
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
        h5py.File = h5_file
        read = _rchar() - before
        opened = _WATCHED.pop("opens")
        _WATCHED.clear()
    return {
        "opens": len(opened),
        "reads": round(read / _size(checkpoint), 2),
        "stops": len(stops),
        "modules": len({module for module, _ in stops}),
        "functions": sorted(f"{module}.{name}" for module, name in stops),
    }


def cases(tmp):
    npz = str(FIXTURES / "official" / "vit_tiny_token.npz")
    h5 = os.path.join(tmp, "tiny.weights.h5")
    keras_vit.VisionTransformer(**OFFICIAL, input_shape=(32, 32, 3),
                                classes=10).save_weights(h5)
    folder = str(FIXTURES / "hub" / "timm_vit_token")
    bare = os.path.join(folder, "model.safetensors")
    cases = {}
    try:
        import torch  # optional: the PyTorch case
    except ImportError:
        torch = None
    if torch is not None:
        from keras_vit.weights import safetensors

        pth = os.path.join(tmp, "vit.pth")
        torch.save({k: torch.from_numpy(v.copy()) for k, v in
                    safetensors.read_safetensors(bare).items()}, pth)
        cases[".pth, builder"] = (lambda: keras_vit.VisionTransformer(**TIMM, weights=pth), pth)
    return cases | {
        "npz, builder": (lambda: keras_vit.VisionTransformer(**OFFICIAL, weights=npz), npz),
        "npz, model_from_checkpoint": (lambda: keras_vit.model_from_checkpoint(npz), npz),
        ".weights.h5, builder": (lambda: keras_vit.VisionTransformer(
            **OFFICIAL, input_shape=(32, 32, 3), classes=10, weights=h5), h5),
        "Hub folder, model_from_checkpoint": (
            lambda: keras_vit.model_from_checkpoint(folder), folder),
        "bare .safetensors, builder": (lambda: keras_vit.VisionTransformer(
            **TIMM, weights=bare), bare),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--functions", action="store_true",
                        help="list the functions each path enters")
    args = parser.parse_args()
    sys.addaudithook(_audit)  # once: an audit hook cannot be removed
    with tempfile.TemporaryDirectory() as tmp:
        rows = {name: walk(call, path) for name, (call, path) in cases(tmp).items()}
    cpu = describe()
    if args.json:
        print(json.dumps({"cpu": cpu, "paths": rows}))
        return
    print(f"CPU: {cpu}")
    print(f"{'path':36} {'opens':>5} {'reads':>6} {'stops':>5} {'modules':>7}")
    for name, row in rows.items():
        print(f"{name:36} {row['opens']:5d} {row['reads']:6.2f} {row['stops']:5d} "
              f"{row['modules']:7d}")
        if args.functions:
            print("    " + "\n    ".join(row["functions"]))


if __name__ == "__main__":
    main()
