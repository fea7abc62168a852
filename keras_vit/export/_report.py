"""The verification report of an export (`ExportReport`), the bars it is
judged by, and what happens to a file that misses them: moved to
`<path>.rejected` with its report, and an `ExportVerificationError`; with
`check=False`, kept and a warning logged."""

import dataclasses
import logging
import os

from keras_vit import _atomic
from keras_vit._console import json_dumps, plural
from keras_vit.errors import ExportVerificationError

logger = logging.getLogger("keras_vit")


def _describe_row(info):
    text = plural(info["images"], "image")
    if info.get("classes") is not None:
        text += f", {plural(info['classes'], 'class', 'classes')}"
    source = info.get("source")
    if info.get("split"):
        text += f" ({source}, split {info['split']!r})"
    elif source:
        text += f" ({source})"
    return text


def _describe_bf16(bf16):
    if not bf16.get("available"):
        return f"not available ({bf16.get('reason')})"
    return (f"max |logit diff| {bf16['max_abs_diff']:.3g}, top-1 agreement "
            f"{100 * bf16['top1_agreement']:.2f}%")


@dataclasses.dataclass
class ExportReport:
    """How far an export is from its Keras model, measured.

    `max_abs_diff` and `top1_agreement` compare the export's logits with
    the Keras model's on the validation images: `validation` is
    `{"split", "images", "classes", "source"}` (source: a data source
    string, `"given array"`, `"given tf.data.Dataset"`, `"calibration
    images"` or `"random pixels"`); `calibration` says the same of the int8
    calibration images (None for other modes). `labels` is the class-name
    file written with the export (None when the model has no class names).
    `passed` / `criteria`: the mode's bar and whether it was met (also with
    `check=False`, which keeps a file that misses it). Latencies are
    medians per batch of `batch_size`. `opset`: the ONNX opset; `runtime`:
    what ran the verification (ONNX Runtime, OpenVINO); `bf16` (OpenVINO):
    the same file at bf16 inference precision, `{"available": True,
    "max_abs_diff", "top1_agreement", "passed"}`, or `{"available": False,
    "reason"}` on a CPU without bf16.

    Example (`report.to_dict()`, abridged):

    ```
    {"format": "tflite", "path": "vit.tflite", "quantization": "int8",
     "calibration": {"split": "train", "images": 500, "classes": 10,
                     "source": "folder:digits"},
     "validation": {"split": "test", "images": 360, "classes": 10,
                    "source": "folder:digits"},
     "labels": "vit.labels.txt", "top1_agreement": 0.994, "passed": true,
     "criteria": "top-1 agreement >= 97%", ...}
    ```
    """

    format: str
    path: str
    quantization: str
    size_bytes: int
    validation: dict
    max_abs_diff: float
    top1_agreement: float
    max_abs_logit: float | None = None
    calibration: dict | None = None
    labels: str | None = None
    batch_size: int = 1
    ops: dict[str, int] | None = None
    builtin_ops_only: bool | None = None
    float_ops: list[str] | None = None
    latency_ms: float | None = None
    keras_latency_ms: float | None = None
    signature: dict | None = None
    passed: bool | None = None
    criteria: str | None = None
    opset: int | None = None  # ONNX: the opset the file declares
    runtime: str | None = None  # what ran the verification, e.g. "onnxruntime 1.22.0 (CPU)"
    bf16: dict | None = None  # OpenVINO: the same file run at bf16 inference precision
    metadata: dict | None = None  # TFLite: the TFLite Metadata inside the file (MediaPipe)
    run_time_sizes: list[dict] | None = None  # the comparison at other sizes (any-size files)

    @property
    def size_mb(self) -> float:
        """The file's size in megabytes (10^6 bytes)."""
        return self.size_bytes / 1e6

    @property
    def validation_images(self):
        """How many images the export was verified on."""
        return self.validation["images"]

    def to_dict(self) -> dict:
        """The report's fields as a dict (JSON types), with `size_mb`."""
        data = dataclasses.asdict(self)
        data["size_mb"] = round(self.size_mb, 3)
        return data

    def to_json(self) -> str:
        """`to_dict()` as strict JSON (NaN and infinities as null)."""
        return json_dumps(self.to_dict())

    def __str__(self):
        rows = [("format", self.format), ("path", self.path),
                ("quantization", self.quantization),
                ("size", f"{self.size_mb:.2f} MB")]
        if self.ops is not None:
            rows.append(("ops", f"{sum(self.ops.values())} ("
                         + ", ".join(f"{k} {v}" for k, v in sorted(self.ops.items())) + ")"))
            rows.append(("built-in ops only", "yes" if self.builtin_ops_only else "NO"))
        if self.float_ops:
            rows.append(("kept in float", ", ".join(self.float_ops)))
        if self.opset is not None:
            rows.append(("opset", str(self.opset)))
        if self.labels:
            rows.append(("labels", self.labels))
        if self.metadata:
            rows.append(("metadata", self.metadata["summary"]))
        if self.runtime:
            rows.append(("verified with", self.runtime))
        if self.calibration:
            rows.append(("calibration", _describe_row(self.calibration)))
        rows.append(("validation", _describe_row(self.validation)))
        rows.append(("max |logit diff| vs Keras", f"{self.max_abs_diff:.3g}"))
        rows.append(("top-1 agreement with Keras", f"{100 * self.top1_agreement:.2f}%"))
        for row in self.run_time_sizes or ():
            rows.append((f"at {_size(row)}", f"max |logit diff| {row['max_abs_diff']:.3g}, "
                         f"top-1 agreement {100 * row['top1_agreement']:.2f}% "
                         f"({plural(row['images'], 'image')})"))
        if self.bf16 is not None:
            rows.append(("bf16 inference", _describe_bf16(self.bf16)))
        if self.latency_ms is not None:
            rows.append(("median latency", f"{self.latency_ms:.2f} ms per batch of "
                         f"{self.batch_size} (Keras: {self.keras_latency_ms:.2f} ms)"))
        if self.criteria:
            verdict = "passed" if self.passed else "FAILED"
            if not self.passed and not self.path.endswith(".rejected"):
                verdict += " (kept: check=False)"
            rows.append(("check", f"{verdict}: {self.criteria}"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _size(row):
    return f"{row['size'][0]}x{row['size'][1]}"


def evaluate(report, max_abs_diff=None, min_top1_agreement=None):
    """Sets `report.passed` and `report.criteria` (the bars, joined by
    "and"; a missed one is marked "MISSED"); returns `report.passed`.

    `max_abs_diff` scales with the logits above 1: the bar is
    `max_abs_diff * max(1, max |Keras logit|)`, float32 rounding being
    relative. The comparisons at `report.run_time_sizes` are held to the
    same bars (each scaled by its own logits); the criteria name those
    sizes and any that misses."""
    rules, passed = _bars(report.max_abs_diff, report.top1_agreement, report.max_abs_logit,
                          max_abs_diff, min_top1_agreement)
    criteria = " and ".join(rules)
    rows = report.run_time_sizes or ()
    missed = [_size(row) for row in rows if not _bars(
        row["max_abs_diff"], row["top1_agreement"], row["max_abs_logit"], max_abs_diff,
        min_top1_agreement)[1]]
    if rows:
        criteria += f" (also at {' and '.join(_size(row) for row in rows)}" + (
            f"; MISSED at {' and '.join(missed)})" if missed else ")")
    report.criteria, report.passed = criteria, bool(passed and not missed)
    return report.passed


def _bars(diff, agreement, max_logit, max_abs_diff, min_top1_agreement):
    """`(rules, passed)`: each bar in words (a missed one marked "MISSED")
    and whether one comparison meets them all."""
    rules, passed = [], True
    if max_abs_diff is not None:
        scale = max(1.0, max_logit or 0.0)
        ok = diff <= max_abs_diff * scale
        rules.append(f"max |diff| <= {max_abs_diff:g}"
                     + (f" x max |logit| {scale:.3g}" if scale > 1 else "")
                     + ("" if ok else " MISSED"))
        passed &= ok
    if min_top1_agreement is not None:
        ok = agreement >= min_top1_agreement
        rules.append(f"top-1 agreement >= {100 * min_top1_agreement:g}%"
                     + ("" if ok else " MISSED"))
        passed &= ok
    return rules, passed


def _measured(report):
    text = (f"max |diff| {report.max_abs_diff:.3g}, top-1 agreement "
            f"{100 * report.top1_agreement:.2f}% on {_describe_row(report.validation)}")
    for row in report.run_time_sizes or ():
        text += (f"; at {_size(row)}: max |diff| {row['max_abs_diff']:.3g}, top-1 "
                 f"agreement {100 * row['top1_agreement']:.2f}%")
    return text


def reject(report, file=None):
    """Moves the export (`file`, default `report.path`) to
    `<report.path>.rejected`, writes the report beside it as
    `<report.path>.rejected.json` and raises `ExportVerificationError`."""
    final = report.path.rstrip("/").rstrip(os.sep)
    rejected = final + ".rejected"
    _atomic.remove_path(rejected)
    _atomic.publish(file or final, rejected)
    report.path = rejected
    report.labels = None
    _atomic.write_text(rejected + ".json", report.to_json() + "\n")
    raise ExportVerificationError(
        f"The {report.format} export ({report.quantization}) fails its check "
        f"({report.criteria}): {_measured(report)}. Kept for inspection at {rejected} "
        f"(its report: {rejected}.json); pass check=False (keras-vit export: --no-check) "
        "to keep it", report)


def log_passed(report):
    """Logs (INFO) one line saying that the export passed its check and
    where it is; the caller prints the report itself (`print(report)`)."""
    logger.info("The %s export (%s) at %s passed its check (%s): %s.", report.format,
                report.quantization, report.path, report.criteria, _measured(report))


def warn_kept(report):
    """Logs that an export missing its bar was kept (`check=False`)."""
    logger.warning(
        "The %s export (%s) at %s misses its check (%s): %s. Kept because check=False "
        "(keras-vit export: --no-check).", report.format, report.quantization, report.path,
        report.criteria, _measured(report))

