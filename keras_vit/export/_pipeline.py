"""The one verified-export pipeline that `to_tflite`, `to_onnx`,
`to_openvino` and `to_saved_model` share.

A format (an `ExportFormat`) says how its file is made, written and run,
and what it adds to the report; `export_verified` does the rest, the same
way for every format:

1. sample the calibration and validation images (`_images.export_images`);
2. convert in memory (`ExportFormat.prepare`);
3. write under a temporary name beside the target (`_files.temporary_path`);
4. load the written file once (`ExportFormat.runner`), run it on the
   validation images and the Keras model on the same pixels, and compare
   the logits; a file that keeps a model's run-time-sized input is
   compared at two other sizes too (`ExportFormat.run_time_sizes`, the
   first `RUN_TIME_SIZE_IMAGES` validation images resized to each);
5. time both with that same runner (the latency of one batch);
6. fill in the `ExportReport` and judge it by the format's bars;
7. move a file that misses them to `<path>.rejected` (raising
   `ExportVerificationError`) unless `check=False`, else rename it into
   place (a full disk while writing is one OSError naming the folder);
8. write the class names (`<stem>.labels.txt`, or what the format keeps);
9. remove every temporary, whatever happened.
"""

import dataclasses
import os

import numpy as np

from keras_vit._atomic import publish, remove_path
from keras_vit.export._files import directory_size, temporary_path
from keras_vit.export._files import disk_full_error, is_disk_full
from keras_vit.export._images import as_images, export_images
from keras_vit.export._labels import labels_beside, model_class_names
from keras_vit.export._measure import compare, keras_latency_ms, median_ms
from keras_vit.export.model import (
    KERAS_QUANTIZED_CHECKS,
    keras_quantized_mode,
    output_kind,
    reference_logits,
)
from keras_vit.export._report import ExportReport, evaluate, log_passed, reject, warn_kept

# The validation images each other size of a run-time-sized export is
# compared on (resized to it): one batch, for the graph's shapes.
RUN_TIME_SIZE_IMAGES = 8


def check_file_path(path, suffix, what, note=""):
    """`str(path)` when it names a file ending with `suffix`; else a
    ValueError (`what`: "a TFLite file name"...; `note` ends the first
    message)."""
    path = str(path)
    if not path.endswith(suffix):
        raise ValueError(f"path={path!r}: {what} ends with {suffix!r}{note}.")
    if os.path.isdir(path):
        raise ValueError(f"path={path!r} is a directory; give a {suffix} file name.")
    return path


def check_quantization(quantization, allowed):
    """`quantization` (None: `"none"`) when it is one of `allowed`; else a
    ValueError naming them."""
    quantization = "none" if quantization is None else quantization
    if quantization not in allowed:
        raise ValueError(f"quantization={quantization!r}; allowed: {allowed} "
                         "(None means 'none').")
    return quantization


@dataclasses.dataclass
class ExportFormat:
    """How one format is written, run and checked, for `export_verified`.

    A subclass sets `name` (the report's `format`) and `checks`
    (quantization -> the bars `evaluate` takes), and implements `write` and
    `runner`; the other methods have defaults that fit a single file with
    `<stem>.labels.txt` beside it. One instance serves one export: the
    arguments are its fields, what `prepare` and `write` find is kept on it
    for the later steps. The written file is loaded once, by `runner`: the
    function it returns gives the logits compared with Keras, is timed for
    the latency (`timed`) and is handed to `report_fields`.

    Example (a format that copies bytes the model was converted to; a
    sketch, skipped by the tests: `convert` and `load_copy` stand for a
    format's converter and runtime):

    >>> class Copy(ExportFormat):  # doctest: +SKIP
    ...     name, checks = "copy", {"none": {"max_abs_diff": 1e-5}}
    ...     def prepare(self, calibration):
    ...         self.content = convert(self.model)
    ...     def write(self, temporary, names):
    ...         with open(temporary, "wb") as f:
    ...             f.write(self.content)
    ...         return temporary
    ...     def runner(self, file):
    ...         return load_copy(file)  # a function of images -> logits
    >>> export_verified(Copy(model, "m.copy", "none", (224, 224)), Sampling())  # doctest: +SKIP
    """

    model: object
    path: str
    quantization: str
    size: tuple
    outputs: str = "auto"
    num_threads: int = None
    # Sizes other than `size` the file runs at, compared as well: a model
    # built with `input_shape=(None, None, 3)` in a format that keeps its
    # run-time-sized input (`export.model.run_time_sizes`); () for one size.
    run_time_sizes: tuple = ()

    name = None
    checks = None
    # Whether the report times one `latency_batch` through the runner and
    # through the Keras model (`latency_ms`, `keras_latency_ms`).
    timed = True

    @property
    def kind(self):
        """What the Keras model outputs, "logits" or "probabilities"
        (`output_kind` of `model` and `outputs`)."""
        return output_kind(self.model, self.outputs)

    def prepare(self, calibration):
        """Converts the model in memory, before any file is written
        (`calibration`: the int8 calibration `ExportData`, or None)."""

    def write(self, temporary, names):
        """Writes the export under `temporary` (a file or a directory of that
        name) with the class names `names` (or None) inside where the format
        keeps them; runs the format's checks of the written file; returns the
        path that `run` opens."""
        raise NotImplementedError

    def inputs(self, images):
        """What the file and the Keras model are both given, from the
        validation pixels (0..255 float32)."""
        return images

    def runner(self, file):
        """Loads the written file (what `write` returned) once; returns a
        function of images (as `inputs` gives them, any number) -> the
        file's logits (NumPy), which the comparison and the latency call."""
        raise NotImplementedError

    def report_fields(self, file, run, images, reference):
        """The `ExportReport` fields this format fills in (batch size,
        signature, ops, runtime...), after the logits are compared (`run`:
        what `runner(file)` returned)."""
        return {}

    def latency_batch(self, images):
        """The batch the runner and the Keras model are timed on."""
        return np.asarray(images[:1], "float32")

    def judge(self, report):
        """Sets `report.passed` / `criteria` by the format's bars; returns
        `report.passed`. A float export of a `model.quantize("int8")` model
        is judged against that model by `KERAS_QUANTIZED_CHECKS` (one int8
        step); its criteria say so."""
        mode = keras_quantized_mode(self.model) if self.quantization == "none" else None
        if mode is None:
            return evaluate(report, **self.checks[self.quantization])
        passed = evaluate(report, **KERAS_QUANTIZED_CHECKS)
        report.criteria += f" (a model.quantize({mode!r}) model: one int8 step)"
        return passed

    def put_in_place(self, temporary):
        """Renames the verified export to `path`."""
        publish(temporary, self.path)

    def label_file(self, names):
        """Writes the class names for the published export; returns where
        (None: the model has none)."""
        return labels_beside(names, self.path)

    def temporaries(self, temporary):
        """Everything this export may leave beside `path`, removed at the end."""
        return [temporary]


def _measure_size(fmt, run, images, size):
    """The file and the Keras model compared at another `size` (height,
    width), on the first `RUN_TIME_SIZE_IMAGES` validation images resized
    to it: a `run_time_sizes` row of the report."""
    images = fmt.inputs(as_images(images, size, RUN_TIME_SIZE_IMAGES))
    max_diff, agreement, max_logit = compare(
        reference_logits(fmt.model, images, fmt.outputs), run(images))
    return {"size": list(size), "images": len(images), "max_abs_diff": max_diff,
            "top1_agreement": agreement, "max_abs_logit": max_logit}


def _measure(fmt, temporary, names, calibration, validation, latency_repeats):
    """Writes the export under `temporary`, runs it and the Keras model on
    the validation images, and returns the `ExportReport` (not yet judged)."""
    file = fmt.write(temporary, names)
    images = fmt.inputs(validation.images)
    reference = reference_logits(fmt.model, images, fmt.outputs)
    run = fmt.runner(file)  # the file is loaded once, for both measures
    max_diff, agreement, max_logit = compare(reference, run(images))
    report = ExportReport(
        format=fmt.name, path=fmt.path, quantization=fmt.quantization,
        size_bytes=directory_size(temporary), validation=validation.info,
        max_abs_diff=max_diff, top1_agreement=agreement, max_abs_logit=max_logit,
        calibration=calibration.info if fmt.quantization == "int8" else None,
        **fmt.report_fields(file, run, images, reference))
    report.run_time_sizes = [_measure_size(fmt, run, validation.images, size)
                             for size in fmt.run_time_sizes] or None
    if fmt.timed:
        batch = fmt.latency_batch(images)
        report.latency_ms = median_ms(lambda: run(batch), latency_repeats)
        report.keras_latency_ms = keras_latency_ms(fmt.model, batch, latency_repeats)
    return report


def export_verified(fmt, sampling, *, check=True, verbose=True, latency_repeats=20):
    """Exports with `fmt` (an `ExportFormat`), verified on the images
    `sampling` (a `Sampling`) picks; returns the `ExportReport`.

    Nothing unverified is ever at `fmt.path`: the export is written under a
    temporary name and renamed into place only once it meets its bars (or
    with `check=False`, which keeps a miss and logs a warning); a miss is
    moved to `<path>.rejected` with `<path>.rejected.json` and raises
    `ExportVerificationError`; any error leaves no temporary behind.

    Example (what `to_onnx` does once its arguments are checked):

    >>> export_verified(_ONNX(model, "vit.onnx", "none", (224, 224)),  # reads /data/digits
    ...                 Sampling(validation_data="folder:/data/digits"))  # doctest: +SKIP
    """
    calibration, validation = export_images(fmt.quantization, sampling, fmt.size)
    fmt.prepare(calibration)
    names = model_class_names(fmt.model)
    temporary = temporary_path(fmt.path)
    try:
        try:
            report = _measure(fmt, temporary, names, calibration, validation,
                              latency_repeats)
        except Exception as error:
            if not is_disk_full(error):
                raise
            raise disk_full_error(error, temporary, fmt.path, fmt.name) from None
        passed = fmt.judge(report)
        if not passed and check:
            reject(report, file=temporary)
        fmt.put_in_place(temporary)
        report.labels = fmt.label_file(names)
    finally:
        for leftover in fmt.temporaries(temporary):
            remove_path(leftover)
    if not passed:
        warn_kept(report)
    elif verbose:
        log_passed(report)
    return report
