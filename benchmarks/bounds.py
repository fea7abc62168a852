"""Memory of the paths that read untrusted or large input, each against a
peer in the same run (issue 25: nothing read may take unbounded memory).

    python benchmarks/bounds.py [--photos 40] [--json docs/performance/bounds.json]

Each case runs in a fresh process and reports its peak RSS (ru_maxrss),
and the peak after its imports alone, next to a peer:

- `predict`: `keras-vit predict` of N 4000x3000 JPEGs (made from
  scikit-learn's two sample photos) vs the same command on one of them:
  streaming holds one batch of resized images and one decoded photo, so
  the two should be close (the per-image path held every decoded photo:
  2.4 GB for 40 on the previous code).
- `npz bomb`: `official.read_checkpoint` of a 512 MiB-of-zeros array
  compressed with bzip2 (a few KB on disk) vs `numpy.load` of it.
- `safetensors`: `safetensors.read_safetensors` of a 360 MB file vs the
  `safetensors` library's `load_file`.

Prints the CPU model and flags; writes one JSON document.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import zipfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from machine import cpu  # noqa: E402  (the same CPU record as the README's)

ROOT = pathlib.Path(__file__).resolve().parent.parent

# A child: baseline RSS after its imports, then the work, then the peak.
CHILD = textwrap.dedent("""
    import json, resource, sys, time
    {imports}
    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    base = rss()
    start = time.perf_counter()
    outcome = "ok"
    try:
        {work}
    except Exception as error:  # what it raised is part of the result
        outcome = f"{{type(error).__name__}}: {{str(error)[:160]}}"
    print(json.dumps({{"peak_mb": rss() / 2**20, "imports_peak_mb": base / 2**20,
                      "peak_above_imports_mb": (rss() - base) / 2**20,
                      "seconds": time.perf_counter() - start, "outcome": outcome}}))
""")


def child(imports, work, env=None):
    code = CHILD.format(imports=imports, work=work)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                                               **(env or {})))
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def predict_rows(tmp, photos):
    import keras

    import keras_vit
    from sklearn.datasets import load_sample_images
    import tensorflow as tf

    folder = pathlib.Path(tmp, "photos")
    folder.mkdir()
    for i in range(photos):
        photo = load_sample_images().images[i % 2]
        big = tf.image.resize(photo, (3000, 4000)).numpy().astype("uint8")
        (folder / f"{i:03d}.jpg").write_bytes(tf.io.encode_jpeg(big, quality=90).numpy())
    model = str(pathlib.Path(tmp, "m224.keras"))
    keras_vit.VisionTransformer(patch_size=16, hidden_size=32, num_layers=1, num_heads=2,
                                mlp_dim=64, input_shape=(224, 224, 3), classes=10).save(model)
    keras.backend.clear_session()
    rows = []
    for what, images in ((f"{photos} photos", str(folder)), ("1 photo", str(folder / "000.jpg"))):
        work = (f"cli.main(['predict', {images!r}, '--model', {model!r}, '--json'], "
                f"out=io.StringIO())")
        row = child("import io\nfrom keras_vit import cli, _console\n"
                    "_console.load_tensorflow()", work)
        rows.append({"case": "predict", "what": f"keras-vit predict, {what} (4000x3000)",
                     **row})
    return rows


def bomb_rows(tmp):
    path = str(pathlib.Path(tmp, "bomb.npz"))
    size = 512 * 2**20
    header = {"descr": "<f4", "fortran_order": False, "shape": (size // 4,)}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_BZIP2) as archive:
        with archive.open("pos_embedding.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, header)
            zeros = bytes(1 << 24)
            for _ in range(size // len(zeros)):
                f.write(zeros)
    on_disk = os.path.getsize(path)
    return [
        {"case": "npz bomb", "what": f"keras_vit read_checkpoint ({on_disk:,} bytes on disk)",
         **child("from keras_vit.weights import official",
                 f"official.read_checkpoint({path!r})")},
        {"case": "npz bomb", "what": "numpy.load (peer)",
         **child("import numpy as np", f"dict(np.load({path!r}))")},
    ]


def safetensors_rows(tmp):
    from safetensors.numpy import save_file

    path = str(pathlib.Path(tmp, "model.safetensors"))
    rng = np.random.default_rng(0)
    save_file({f"blocks.{i}.weight": rng.standard_normal((3072, 768), dtype=np.float32)
               for i in range(40)}, path)
    mb = os.path.getsize(path) / 1e6
    return [
        {"case": "safetensors", "what": f"keras_vit read_safetensors ({mb:.0f} MB)",
         **child("from keras_vit.weights import safetensors",
                 f"safetensors.read_safetensors({path!r})")},
        {"case": "safetensors", "what": "safetensors.numpy.load_file (peer)",
         **child("from safetensors.numpy import load_file", f"load_file({path!r})")},
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=int, default=40)
    parser.add_argument("--json", default=str(ROOT / "docs" / "performance" / "bounds.json"))
    args = parser.parse_args(argv)
    machine = cpu()
    print(f"CPU: {machine['model']}, {machine['cores']} cores, flags {machine['flags']}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = bomb_rows(tmp) + safetensors_rows(tmp) + predict_rows(tmp, args.photos)
    for row in rows:
        print(f"{row['case']:<12} {row['what']:<58} peak {row['peak_mb']:6.0f} MB "
              f"(imports {row['imports_peak_mb']:4.0f}) {row['seconds']:6.2f} s  "
              f"{row['outcome'][:70]}")
    document = {"cpu": machine, "command": "python benchmarks/bounds.py", "rows": rows}
    pathlib.Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
