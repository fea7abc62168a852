"""Regenerates every measured number in the README and the docs/ pages
from the commands they show next to them, with the date, the CPU model and
its flags.

    python benchmarks/readme_numbers.py            # run, write docs/readme_numbers.json,
                                                   # rewrite the pages' marked blocks
    python benchmarks/readme_numbers.py --render   # only rewrite the pages from the JSON

The generated blocks sit between `<!-- readme_numbers:NAME -->` and
`<!-- /readme_numbers:NAME -->`, each in one of `PAGES` (README.md: the
quickstart, quantize, lora and parity blocks; docs/deploy.md: the export tables);
`tests/test_readme.py` checks that they are what this script renders from
`docs/readme_numbers.json`. Takes about 6 minutes on 2 cores (the
quickstart, nine exports, the parity demo).
"""

import argparse
import datetime
import json
import pathlib
import platform
import re
import shutil
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from machine import cpu  # noqa: E402  (the CPU record of the README's numbers)

ROOT = pathlib.Path(__file__).resolve().parent.parent
JSON_PATH = ROOT / "docs" / "readme_numbers.json"
README = ROOT / "README.md"
# The pages that hold the generated blocks.
PAGES = (README, ROOT / "docs" / "deploy.md")
RUN = "runs/readme"
QUICKSTART = f"keras-vit quickstart --out {RUN}/quickstart"
EXPORT = (f"keras-vit export {RUN}/quickstart/model.keras --format tflite --quantize {{mode}} "
          f"--calibration folder:{RUN}/quickstart/digits --out {RUN}/digits_{{mode}}.tflite "
          "--json")
SERVER_EXPORT = (f"keras-vit export {RUN}/quickstart/model.keras --format {{format}} "
                 f"--quantize {{mode}}{{calibration}} --validation folder:{RUN}/quickstart/digits "
                 f"--out {RUN}/digits_{{mode}}.{{suffix}} --json")
PARITY = "python examples/classify_photos.py --json"
QUANTIZE = (f"python benchmarks/quantize.py --model {RUN}/quickstart/model.keras "
            f"--data folder:{RUN}/quickstart/digits --json")
LORA = "python benchmarks/lora.py --json"
MODES = ("none", "float16", "dynamic", "int8")
# (format, --quantize, file suffix) of the ONNX / OpenVINO table.
SERVER_MODES = (("onnx", "none", "onnx"), ("onnx", "dynamic", "onnx"), ("onnx", "int8", "onnx"),
                ("openvino", "none", "xml"), ("openvino", "float16", "xml"))


def command(line):
    """Runs a README command line; returns its last stdout line as JSON."""
    print(f"$ {line}", file=sys.stderr, flush=True)
    args = line.split()
    if args[0] == "keras-vit":
        args = [sys.executable, "-m", "keras_vit.cli", *args[1:]]
    elif args[0] == "python":
        args = [sys.executable, *args[1:]]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{line} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure():
    numbers = {"date": datetime.date.today().isoformat(), "cpu": cpu(),
               "python": platform.python_version()}
    # The README's command as shown: a finished quickstart in the folder
    # (the last measurement) would be refused without --overwrite.
    shutil.rmtree(ROOT / RUN / "quickstart", ignore_errors=True)
    quick = command(QUICKSTART)
    numbers["quickstart"] = {
        "command": QUICKSTART, "test_accuracy": quick["test_accuracy"],
        "seconds": quick["seconds"], "parameters": quick["parameters"],
        "epochs": quick["epochs"], "train_examples": quick["train_examples"],
        "test_examples": quick["test_examples"],
        "tflite_kb": round(quick["tflite_report"]["size_bytes"] / 1e3),
        "tflite_agreement": quick["tflite_report"]["top1_agreement"],
        "tflite_ms": quick["tflite_report"]["latency_ms"],
        "keras_ms": quick["tflite_report"]["keras_latency_ms"],
    }
    numbers["tflite_digits"] = []
    for mode in MODES:
        line = EXPORT.format(mode=mode)
        report = command(line)
        numbers["tflite_digits"].append({
            "command": line, "mode": mode, "size_kb": round(report["size_bytes"] / 1e3),
            "max_abs_diff": report["max_abs_diff"],
            "top1_agreement": report["top1_agreement"], "passed": report["passed"],
            "calibration": report.get("calibration"), "validation": report["validation"]})
    numbers["server_digits"] = []
    for fmt, mode, suffix in SERVER_MODES:
        calibration = (f" --calibration folder:{RUN}/quickstart/digits"
                       if mode == "int8" else "")
        line = SERVER_EXPORT.format(format=fmt, mode=mode, suffix=suffix,
                                    calibration=calibration)
        report = command(line)
        numbers["server_digits"].append({
            "command": line, "format": fmt, "mode": mode,
            "size_kb": round(report["size_bytes"] / 1e3),
            "max_abs_diff": report["max_abs_diff"],
            "top1_agreement": report["top1_agreement"], "passed": report["passed"],
            "runtime": report.get("runtime"), "opset": report.get("opset"),
            "calibration": report.get("calibration"), "validation": report["validation"]})
    numbers["quantize"] = command(QUANTIZE)
    numbers["lora"] = command(LORA)
    parity = command(PARITY)
    numbers["parity"] = {"command": PARITY, "rows": [
        {k: row.get(k) for k in ("checkpoint", "model", "max_abs_diff_vs_official",
                                 "resized_to", "max_abs_diff_vs_official_resized",
                                 "max_abs_diff_vs_original", "within_tolerance")}
        for row in parity["results"]]}
    return numbers


def _where(n):
    cpu_ = n["cpu"]
    flags = ", ".join(cpu_["flags"]) or "no AVX-512/AMX"
    return f"{cpu_['model']}, {cpu_['cores']} cores ({flags}), {n['date']}"


def render(n):
    """Block name -> markdown."""
    q = n["quickstart"]
    blocks = {"quickstart": (
        f"Measured by `python benchmarks/readme_numbers.py` ({_where(n)}): "
        f"`{q['command']}` reached **{100 * q['test_accuracy']:.1f}% test accuracy in "
        f"{q['seconds']:.0f} s** ({q['epochs']} epochs, {q['parameters']:,} parameters, "
        f"{q['train_examples']:,} training and {q['test_examples']} test digits; target: "
        ">= 97% in <= 3 minutes; seeded, so a rerun on the same CPU repeats it). "
        "It saves `model.keras` (with the class names), `best.keras`, `labels.txt`, "
        "`log.csv` and TensorBoard logs, then exports `model_dynamic_int8.tflite` "
        f"({q['tflite_kb']} KB) and prints its verification on the {q['test_examples']} "
        f"test digits ({100 * q['tflite_agreement']:.0f}% top-1 agreement with Keras, "
        f"{q['tflite_ms']:.2f} ms per image vs {q['keras_ms']:.2f} ms in Keras).")}
    rows = ["| `--quantize` | size | max \\|logit diff\\| | top-1 agreement with Keras "
            "| calibration | verification |", "| --- | --- | --- | --- | --- | --- |"]
    for r in n["tflite_digits"]:
        cal = r["calibration"]
        cal_text = (f"{cal['images']} `{cal['split']}` images, {cal['classes']} classes"
                    if cal else "-")
        val = r["validation"]
        rows.append(f"| {r['mode']} | {r['size_kb']} KB | {r['max_abs_diff']:.2g} | "
                    f"{100 * r['top1_agreement']:.2f}% | {cal_text} | {val['images']} "
                    f"`{val['split']}` images, {val['classes']} classes |")
    blocks["tflite_digits"] = (
        f"Measured by `python benchmarks/readme_numbers.py` ({_where(n)}) on the "
        "quickstart's digits ViT with, for each mode,\n`" + EXPORT.format(mode="MODE")
        + "`:\n\n" + "\n".join(rows))
    rows = ["| `--format` | `--quantize` | size | max \\|logit diff\\| | top-1 agreement "
            "with Keras | calibration | verified with |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in n.get("server_digits", []):
        cal = r["calibration"]
        cal_text = (f"{cal['images']} `{cal['split']}` images" if cal else "-")
        val = r["validation"]
        rows.append(f"| {r['format']} | {r['mode']} | {r['size_kb']} KB | "
                    f"{r['max_abs_diff']:.2g} | {100 * r['top1_agreement']:.2f}% | {cal_text} | "
                    f"{r['runtime']}, {val['images']} `{val['split']}` images |")
    blocks["server_digits"] = (
        f"Measured by `python benchmarks/readme_numbers.py` ({_where(n)}) on the "
        "quickstart's digits ViT with, for each row,\n`" + SERVER_EXPORT.format(
            format="FORMAT", mode="MODE", suffix="SUFFIX",
            calibration=" [--calibration folder:runs/readme/quickstart/digits]")
        + "` (`--calibration` for int8):\n\n" + "\n".join(rows))
    rows = ["| checkpoint | model | max \\|logit diff\\| at its resolution "
            "| loaded at another resolution (posemb resized) |", "| --- | --- | ---: | ---: |"]
    for r in n["parity"]["rows"]:
        diff = r.get("max_abs_diff_vs_official")
        if diff is None:
            diff = r.get("max_abs_diff_vs_original")
        resized = r.get("max_abs_diff_vs_official_resized")
        rows.append(f"| {r['checkpoint']} | {r['model']} | {diff:.1e} | "
                    + (f"{resized:.1e} ({r['resized_to']} px)" if resized is not None
                       else "n/a") + " |")
    blocks["parity"] = (f"Measured by `{n['parity']['command']}` ({_where(n)}):\n\n"
                        + "\n".join(rows))
    if "quantize" in n:
        blocks["quantize"] = _quantize_block(n["quantize"])
    if "lora" in n:
        blocks["lora"] = _lora_block(n["lora"])
    return blocks


def _span(digits):
    """ "01234" -> "0-4" """
    return f"{digits[0]}-{digits[-1]}"


def _lora_block(q):
    """The README's table of `benchmarks/lora.py` (its own CPU and date)."""
    rows = ["| fine-tuning | test accuracy | trainable weights | seconds |",
            "| --- | ---: | ---: | ---: |"]
    for r in q["rows"]:
        rows.append(f"| {r['run']} | {100 * r['test_accuracy']:.1f}% | "
                    f"{r['trainable_parameters']:,} ({100 * r['trainable_fraction']:.1f}%) | "
                    f"{r['seconds']:.0f} |")
    pre, ft = q["pretrain"], q["finetune"]
    return (f"Measured by `{q['command']}` ({_where(q)}, Keras {q['keras']}): the "
            f"quickstart's ViT trained from scratch on the digits {_span(pre['digits'])} "
            f"({pre['epochs']} epochs, {100 * pre['test_accuracy']:.1f}% on their test "
            f"digits), then fine-tuned for {ft['epochs']} epochs on the digits "
            f"{_span(ft['digits'])} "
            f"({ft['train_images']} training images; a new head; the `scratch` recipe, seed "
            f"0), tested on their {ft['test_images']} held-out digits:\n\n" + "\n".join(rows))


def _quantize_block(q):
    """The README's tables of `benchmarks/quantize.py`'s rows (its own CPU
    and date: it can be measured apart from the other numbers)."""
    digits = [r for r in q["rows"] if r["model"].startswith("digits")]
    rows = ["| `model.quantize` | top-1 agreement with float | max \\|logit diff\\| | weights |",
            "| --- | ---: | ---: | ---: |"]
    for r in digits:
        rows.append(f"| {r['mode']} | {100 * r['top1_agreement']:.2f}% | "
                    f"{r['max_abs_diff']:#.2g} ({100 * r['relative_diff']:.1f}% of the largest) "
                    f"| {r['weight_bytes'] / 1e3:,.0f} KB |")
    modes = [r["mode"] for r in digits if r["mode"] != "float32"]
    fixtures = ["| official fixture | " + " | ".join(modes) + " |",
                "| --- |" + " ---: |" * len(modes)]
    for name in dict.fromkeys(r["model"] for r in q["rows"] if r not in digits):
        cells = {r["mode"]: f"{100 * r['relative_diff']:.1f}%" for r in q["rows"]
                 if r["model"] == name}
        fixtures.append(f"| {name.replace('official fixture ', '')} | "
                        + " | ".join(cells[m] for m in modes) + " |")
    where = _where({"cpu": q["cpu"], "date": q["date"]})
    return (f"Measured by `{q['command']}` ({where}, Keras {q['keras']}; every quantized "
            "model reloads with the same logits). On the quickstart's digits ViT, over the "
            f"{q['test_images']} test digits:\n\n" + "\n".join(rows)
            + "\n\nOn the official parity fixtures (synthetic weights, 4 photo crops), the "
            "largest logit difference as a fraction of the largest logit:\n\n"
            + "\n".join(fixtures))


def rewrite_pages(blocks, texts):
    """`texts` ({page name: markdown}) with each block of `blocks` rewritten
    in the one page that holds its markers; a block in no page, or in
    several, stops with one sentence.

    >>> rewrite_pages({"x": "new"}, {"a.md": "<!-- readme_numbers:x -->\\nold\\n"
    ...                                      "<!-- /readme_numbers:x -->", "b.md": ""})["a.md"]
    '<!-- readme_numbers:x -->\\nnew\\n<!-- /readme_numbers:x -->'
    """
    texts = dict(texts)
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- readme_numbers:{name} -->\n).*?(\n<!-- /readme_numbers:"
                             rf"{name} -->)", re.S)
        holders = [page for page, text in texts.items() if pattern.search(text)]
        if len(holders) != 1:
            raise SystemExit(f"<!-- readme_numbers:{name} --> must be in exactly one of "
                             f"{', '.join(texts)}; it is in {len(holders)}.")
        page = holders[0]
        texts[page] = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(2),
                                  texts[page])
    return texts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--render", action="store_true",
                        help="only rewrite the pages from docs/readme_numbers.json")
    args = parser.parse_args(argv)
    if args.render:
        numbers = json.loads(JSON_PATH.read_text())
    else:
        numbers = measure()
        JSON_PATH.write_text(json.dumps(numbers, indent=1) + "\n")
        print(f"wrote {JSON_PATH.relative_to(ROOT)}", file=sys.stderr)
    texts = {str(page.relative_to(ROOT)): page.read_text() for page in PAGES}
    for name, text in rewrite_pages(render(numbers), texts).items():
        (ROOT / name).write_text(text)
    print(json.dumps(numbers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
