"""A full-size ViT-B/16 through `keras_vit.export.to_hub_folder` and back
into timm and transformers: the seconds the export takes (verification
included), the folder's size, and the largest logit difference between
keras_vit and each library's own model on the two sample photos.

    python benchmarks/hub_export.py --json

Needs PyTorch, transformers and timm (installed by `.ci/run`; timm
without torchvision, whose stand-in `tests/torch_libraries.py` provides).
The ViT-B/16 has random weights (seeded, near the scale of trained ones)
and a 10-class head; its arithmetic is the official one (tanh GELU), which
the folders carry (`gelu_tanh`, `gelu_pytorch_tanh`). The last line is one
JSON object; it records the CPU.
"""

import argparse
import datetime
import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
from machine import cpu  # noqa: E402  (the same CPU record as the README's)
from torch_libraries import import_timm, library_logits  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="only the JSON line on stdout")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import transformers  # noqa: F401  (before timm's torchvision stand-in)

    timm = import_timm()
    from sklearn.datasets import load_sample_images
    from PIL import Image

    import keras

    import keras_vit
    from keras_vit import export

    photos = np.stack([np.asarray(Image.fromarray(image).resize((224, 224), Image.BILINEAR))
                       for image in load_sample_images().images]).astype("float32")
    keras.utils.set_random_seed(0)  # the initial weights too: the same model every run
    model = keras_vit.ViTB16(weights=None, classes=10, classifier_activation=None)
    rng = np.random.default_rng(0)
    model.set_weights([w + 0.02 * rng.normal(size=w.shape).astype("float32")
                       for w in model.get_weights()])
    keras_logits = np.asarray(model(photos))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for library in ("timm", "transformers"):
            folder = pathlib.Path(tmp) / library
            start = time.perf_counter()
            report = export.to_hub_folder(model, folder, library=library, verbose=False)
            seconds = time.perf_counter() - start
            got = library_logits(library, folder, photos, timm)
            rows.append({"library": library, "export_seconds": round(seconds, 1),
                         "size_mb": round(report.size_mb, 1),
                         "verification_max_abs_diff": report.max_abs_diff,
                         "library_max_abs_diff": float(np.abs(got - keras_logits).max()),
                         "max_abs_logit": float(np.abs(keras_logits).max())})
            if not args.json:
                print(rows[-1], file=sys.stderr)
    print(json.dumps({"command": "python benchmarks/hub_export.py --json", "cpu": cpu(),
                      "date": datetime.date.today().isoformat(), "model": "ViT-B/16, 224 px",
                      "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
