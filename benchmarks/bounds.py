"""Memory and time of the paths that read untrusted or large input, each
against a peer in the same run (issues 25 and 46: nothing read may take
memory or time that a file dictates).

    python benchmarks/bounds.py [--photos 40] [--pickle-kib 8192] [--rounds 3]
        [--bomb-mib 2048] [--cases npz,safetensors,predict,pytorch,keras]
        [--json docs/performance/bounds.json]

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
- `pytorch stride 0`: `pytorch.read_torch_state` of a .pth of a few hundred
  bytes whose one tensor is a stride-0 view of 4 floats that would expand
  to 1 GiB (refused) vs a process that only imports the reader.
- `.keras bomb`: `load_keras_model` of a .keras whose `model.weights.h5`,
  then whose `config.json`, is deflated from `--bomb-mib` MiB (a few MB on
  disk; refused) vs loading the genuine tiny model's .keras file.

And one time (`timings`), in this process, medians of `--rounds` rounds
interleaved:

- `pytorch long key`: `pytorch.read_torch_state` of a `--pickle-kib`
  data.pkl (8 MiB, the most the reader takes) holding one key
  `"module." * N + "w"`, then `"model." * N + "w"` (the last prefix tried),
  each against the same key at half the size (a ratio near 2 says the
  strip is linear, 4 quadratic) and against a data.pkl of the full size
  holding the plain key `"w"` and a string of padding beside its state
  dict (a training checkpoint's shape: what the rest of the reader costs).
  The quadratic strip before 6f98fbb is not run (`BEFORE_THE_FIX`).

`--in-process` runs the children in this process (for the test: their
peaks are then this process's).

Prints the CPU model and flags; writes one JSON document.
"""

import argparse
import contextlib
import io
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
# the hand-written torch.save pickles the reader's tests use
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from machine import cpu, describe  # noqa: E402  (the same CPU record as the README's)
import torch_pickles  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
CASES = ("npz", "safetensors", "predict", "pytorch", "keras")
FRESH = True  # False (--in-process): children run in this process

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
    if not FRESH:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "<bounds child>", "exec"), {})
        return json.loads(out.getvalue().strip().splitlines()[-1])
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


def torch_file(path, payload, storage):
    """A torch.save zip of `payload` (data.pkl) and storage 0; its path."""
    return torch_pickles.torch_zip(path, payload, {"0": storage})


def long_key_timing(tmp, pickle_bytes, rounds):
    """Seconds (median of `rounds`, interleaved) of `read_torch_state` on a
    data.pkl of `pickle_bytes` holding one key of wrapper prefixes, on the
    same key at half the size (twice the bytes take twice the time where
    the strip is linear, four times where it is quadratic), and on a peer of
    the full size: the key "w" and padding beside it (what the rest of the
    reader costs)."""
    from keras_vit.weights.pytorch import read_torch_state

    six = np.arange(6, dtype="<f4").tobytes()
    tensor = torch_pickles.tensor(torch_pickles.storage(6))
    state = lambda key: b"\x80\x02" + torch_pickles.mapping([(key, tensor)]) + b"."  # noqa: E731
    files, halves = {}, {}
    for prefix in ("module.", "model."):
        whole, half = ((size - len(state("w"))) // len(prefix)
                       for size in (pickle_bytes, pickle_bytes // 2))
        for count in (whole, half):
            files[f"one key {prefix!r} * {count:,} + 'w'"] = state(prefix * count + "w")
        halves[f"one key {prefix!r} * {whole:,} + 'w'"] = f"one key {prefix!r} * {half:,} + 'w'"
    size = len(files[next(iter(files))])
    shell = b"\x80\x02}(" + torch_pickles.s("state_dict") + torch_pickles.mapping([("w", tensor)]) \
        + torch_pickles.s("args")
    padding = size - len(shell + torch_pickles.s("") + b"u.")
    peer = "peer: key 'w', padding beside the state dict"
    files[peer] = shell + torch_pickles.s("x" * padding) + b"u."
    paths = {what: torch_file(pathlib.Path(tmp, f"long{i}.pth"), payload, six)
             for i, (what, payload) in enumerate(files.items())}
    times = {what: [] for what in files}
    for r in range(rounds):
        order = list(paths)[r % len(paths):] + list(paths)[:r % len(paths)]
        for what in order:
            start = time.perf_counter()
            state_read = read_torch_state(paths[what])
            times[what].append(time.perf_counter() - start)
            assert list(state_read) == ["w"], (what, list(state_read)[:1])
    median = {what: float(np.median(seconds)) for what, seconds in times.items()}
    return [{"case": "pytorch long key", "what": what, "data_pkl_bytes": len(files[what]),
             "seconds": median[what], "rounds_s": times[what],
             "ratio_to_peer": median[what] / median[peer],
             **({"ratio_to_half_size": median[what] / median[halves[what]]}
                if what in halves else {})}
            for what in files]


def stride0_rows(tmp):
    """A .pth of a few hundred bytes: a (16384, 16384) stride-0 view of
    storage 0's 4 floats, 1 GiB if expanded."""
    payload = b"\x80\x02" + torch_pickles.mapping(
        [("w", torch_pickles.tensor(torch_pickles.storage(4), (16384, 16384), (0, 0)))]) + b"."
    path = torch_file(pathlib.Path(tmp, "expand.pth"), payload, bytes(16))
    on_disk = os.path.getsize(path)
    imports = "from keras_vit.weights.pytorch import read_torch_state"
    return [
        {"case": "pytorch stride 0",
         "what": f"read_torch_state, a 1 GiB stride-0 view ({on_disk:,} bytes on disk)",
         **child(imports, f"read_torch_state({path!r})")},
        {"case": "pytorch stride 0", "what": "the reader imported, nothing read (peer)",
         **child(imports, "pass")},
    ]


def keras_rows(tmp, bomb_mib):
    """A genuine tiny .keras file, and two copies of it whose weights
    member, then config.json, is deflated from `bomb_mib` MiB."""
    import keras

    import keras_vit

    genuine = str(pathlib.Path(tmp, "tiny.keras"))
    keras_vit.VisionTransformer(patch_size=8, hidden_size=16, num_layers=1, num_heads=2,
                                mlp_dim=32, input_shape=(32, 32, 3), classes=3).save(genuine)
    keras.backend.clear_session()
    with zipfile.ZipFile(genuine) as archive:
        files = {info.filename: archive.read(info) for info in archive.infolist()}
    zeros, size = bytes(1 << 24), bomb_mib << 20
    bombs = {}
    for member, head, tail in (("model.weights.h5", files["model.weights.h5"], b""),
                               ("config.json", files["config.json"][:-1], b"}")):
        path = bombs[member] = str(pathlib.Path(tmp, f"bomb-{member}.keras"))
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in files.items():
                if name != member:
                    archive.writestr(name, data)
            # a valid HDF5 file with zeros behind it; valid JSON with spaces inside
            info = zipfile.ZipInfo(member)
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as f:
                f.write(head)
                left = size - len(head) - len(tail)
                pad = zeros if member != "config.json" else b" " * len(zeros)
                while left > 0:
                    f.write(pad[:left])
                    left -= len(pad)
                f.write(tail)
    imports = "import keras\nfrom keras_vit._saving import load_keras_model"
    rows = [{"case": ".keras bomb",
             "what": f"load_keras_model, {member} of {size >> 20:,} MiB "
                     f"({os.path.getsize(path) / 1e6:.1f} MB on disk)",
             **child(imports, f"load_keras_model({path!r})")}
            for member, path in bombs.items()]
    rows.append({"case": ".keras bomb", "what": "load_keras_model, the genuine tiny .keras (peer)",
                 **child(imports, f"load_keras_model({genuine!r})")})
    return rows


# The quadratic strip this benchmark no longer runs (it copied the key once per
# prefix): measured before 6f98fbb, with the same one-key files.
BEFORE_THE_FIX = ("one 'module.' * N key, before 6f98fbb (each prefix copied the key): "
                  "200 KB 1.60 s, 1.26 MB 56 s; quadratic, so about 45 minutes at 8 MiB "
                  "(not run here)")


def main(argv=None):
    global FRESH
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=int, default=40)
    parser.add_argument("--pickle-kib", type=int, default=8192,
                        help="the long-key data.pkl's size (default: 8 MiB, the reader's bound)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the long-key timing")
    parser.add_argument("--bomb-mib", type=int, default=2048,
                        help="what the .keras bombs' members expand to (over 64 MiB)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"some of {','.join(CASES)} (default: all)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the children in this process (their peaks are its own)")
    parser.add_argument("--json", default=str(ROOT / "docs" / "performance" / "bounds.json"))
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"--cases: unknown {unknown}; allowed: {', '.join(CASES)}")
    FRESH = not args.in_process
    machine = cpu()
    print(f"CPU: {describe(machine)}, {machine['cores']} cores")
    rows, timings = [], []
    with tempfile.TemporaryDirectory() as tmp:
        if "npz" in cases:
            rows += bomb_rows(tmp)
        if "safetensors" in cases:
            rows += safetensors_rows(tmp)
        if "pytorch" in cases:
            rows += stride0_rows(tmp)
            timings += long_key_timing(tmp, args.pickle_kib << 10, args.rounds)
        if "keras" in cases:
            rows += keras_rows(tmp, args.bomb_mib)
        if "predict" in cases:
            rows += predict_rows(tmp, args.photos)
    for row in rows:
        print(f"{row['case']:<16} {row['what']:<66} peak {row['peak_mb']:6.0f} MB "
              f"(imports {row['imports_peak_mb']:4.0f}) {row['seconds']:6.2f} s  "
              f"{row['outcome'][:70]}")
    for row in timings:
        half = (f", x{row['ratio_to_half_size']:.2f} at half the size"
                if "ratio_to_half_size" in row else "")
        print(f"{row['case']:<16} {row['what']:<46} {row['data_pkl_bytes']:>10,} bytes "
              f"{row['seconds']:7.3f} s (x{row['ratio_to_peer']:.1f} the peer{half})")
    if timings:
        print(f"before the fix: {BEFORE_THE_FIX}")
    command = " ".join(["python benchmarks/bounds.py", *(argv if argv is not None
                                                         else sys.argv[1:])])
    document = {"cpu": machine, "command": command, "rows": rows}
    if timings:
        document.update(timings=timings, before_the_fix=BEFORE_THE_FIX)
    pathlib.Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.json}")
    return document


if __name__ == "__main__":
    main()
