"""Training curves: `curves.png` of a run folder, drawn from its `log.csv`
(one row per epoch: `epoch` from 1, `loss`, `accuracy`, `val_loss`,
`val_accuracy`; `callbacks.EpochLogger` writes it): the loss and the
accuracy per epoch, training and validation, with the best epoch (the
highest finite `val_accuracy`, as `best.keras`) marked. `train` draws it
at the end of every run; `keras-vit plot RUN_DIR` draws it again, for a
finished run, one still going, or a resumed one.

A run folder is untrusted input: `read_log` reads at most `MAX_LOG_BYTES`
of a regular file (never through a link) and turns anything that is not
the log of a run (a missing column, a field that is not a number, epochs
out of order, a file too large) into one ValueError naming the file.

This module loads no NumPy, TensorFlow or Keras (`keras-vit plot` imports
none of them); matplotlib is imported when a picture is drawn.

>>> import os, tempfile
>>> run = tempfile.mkdtemp()
>>> with open(os.path.join(run, "log.csv"), "w") as f:
...     _ = f.write("epoch,accuracy,loss,val_accuracy,val_loss\\n"
...                 "1,0.5,1.2,0.55,1.1\\n2,0.7,0.8,0.75,0.9\\n3,0.8,0.6,0.7,0.95\\n")
>>> log = read_log(os.path.join(run, "log.csv"))
>>> log.epochs, log.best_epoch()
([1, 2, 3], 2)
>>> result = plot_run(run)
>>> os.path.basename(result["curves"]), result["epochs"], result["best_epoch"]
('curves.png', 3, 2)
"""

import csv
import dataclasses
import io
import math
import os
import stat

from keras_vit import _plots

LOG = "log.csv"
CURVES = "curves.png"
# A log row is about 100 bytes: 16 MiB is some 150,000 epochs.
MAX_LOG_BYTES = 16 << 20
# The columns drawn (those a log has; `epoch` and `loss` it must have).
REQUIRED = ("epoch", "loss")
DRAWN = ("loss", "val_loss", "accuracy", "val_accuracy")


@dataclasses.dataclass(frozen=True)
class TrainingLog:
    """A run's `log.csv`, checked: `epochs` (1, 2, ... N) and `values`
    ({column: [float per epoch]}; NaN and inf as logged, e.g. by a run that
    diverged)."""

    path: str
    epochs: list
    values: dict

    def best_epoch(self, monitor="val_accuracy"):
        """The first epoch of the highest finite `monitor` whose loss is
        finite too (how `BestModelCheckpoint` chooses `best.keras`), or
        None (no such column, or no finite value)."""
        scores = self.values.get(monitor)
        if scores is None:
            return None
        best = None
        for epoch, score, loss in zip(self.epochs, scores, self.values["loss"], strict=True):
            if math.isfinite(score) and math.isfinite(loss) and (
                    best is None or score > best[1]):
                best = (epoch, score)
        return None if best is None else best[0]


def _read_text(path):
    """The text of the regular file `path` (UTF-8, at most MAX_LOG_BYTES),
    never through a link, or a ValueError naming it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ValueError(f"{path} is not there: a run folder holds log.csv once its first "
                         "epoch has ended.") from None
    except OSError as error:
        why = ("a symbolic link" if os.path.islink(path)
               else error.strerror or type(error).__name__)
        raise ValueError(f"{path} cannot be read as a training log ({why}).") from None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{path} is not a regular file, so it is not a training log.")
        data = f.read(MAX_LOG_BYTES + 1)
    if len(data) > MAX_LOG_BYTES:
        raise ValueError(f"{path} holds more than {MAX_LOG_BYTES:,} bytes, more than the "
                         "log of any run (one row per epoch); it is not a training log.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text (byte {error.start:,}), so it is not a "
                         "training log.") from None


def _number(text, path, row, column):
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{path} row {row}: {column} is {str(text)[:40]!r}, not a number; "
                         "it is not a log keras-vit train wrote.") from None


def read_log(path):
    """The `TrainingLog` of the `log.csv` at `path`; a ValueError in one
    sentence naming the file for anything else."""
    text = _read_text(path)
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as error:
        raise ValueError(f"{path} cannot be read as CSV ({error}).") from None
    if not rows:
        raise ValueError(f"{path} is empty: no epoch has ended yet.")
    header, rows = rows[0], [row for row in rows[1:] if row]
    missing = [column for column in REQUIRED if column not in header]
    if missing:
        raise ValueError(f"{path} has no {' or '.join(missing)} column (its columns: "
                         f"{', '.join(header)[:200] or 'none'}); it is not a log keras-vit "
                         "train wrote.")
    if not rows:
        raise ValueError(f"{path} holds no epoch yet (only its header).")
    columns = {name: header.index(name) for name in DRAWN + ("epoch",) if name in header}
    values = {name: [] for name in columns}
    for number, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise ValueError(f"{path} row {number} has {len(row)} fields, but its header "
                             f"has {len(header)}; it is not a log keras-vit train wrote.")
        for name, index in columns.items():
            values[name].append(_number(row[index], path, number, name))
    epochs = values.pop("epoch")
    if epochs != list(range(1, len(epochs) + 1)):
        shown = ", ".join(f"{e:g}" for e in epochs[:6]) + (", ..." if len(epochs) > 6 else "")
        raise ValueError(f"{path} records the epochs {shown}, not 1, 2, 3, ... in order; "
                         "it is not a log keras-vit train wrote.")
    return TrainingLog(path, [int(e) for e in epochs], values)


def plot_log(log, path, title=None):
    """Draws `log` (a `TrainingLog`) into the PNG `path`: the loss (left)
    and the accuracy (right) per epoch, training and validation, the best
    epoch marked. Returns `path`."""
    fig = _plots.figure((10, 4), CURVES)
    axes = fig.subplots(1, 2)
    best = log.best_epoch()
    for ax, metric in zip(axes, ("loss", "accuracy"), strict=True):
        for name, label in ((metric, "training"), (f"val_{metric}", "validation")):
            if name in log.values:
                ax.plot(log.epochs, log.values[name], marker="." if len(log.epochs) <= 50
                        else None, label=label)
        if best is not None:
            ax.axvline(best, color="grey", linestyle="--", linewidth=1,
                       label=f"best epoch {best}")
        if metric == "accuracy" and best is not None:
            value = log.values["val_accuracy"][best - 1]
            ax.plot([best], [value], "o", color="tab:red",
                    label=f"best val_accuracy {value:.4f}")
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        if len(log.epochs) <= 20:
            ax.set_xticks(log.epochs)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _plots.save(fig, path)


def plot_run(run_dir, out=None):
    """Draws `curves.png` (or `out`) from the `log.csv` of the run folder
    `run_dir`; returns what `keras-vit plot --json` prints: `run`, `log`,
    `curves` (the PNG written), `epochs`, `best_epoch` and
    `best_val_accuracy` (None without a finite `val_accuracy`), `columns`
    (those drawn)."""
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise ValueError(f"{run_dir!r} is not a folder; give the run folder of keras-vit "
                         "train (its --out).")
    _plots.require("matplotlib", CURVES)  # before reading: the one-line install hint
    log = read_log(os.path.join(run_dir, LOG))
    best = log.best_epoch()
    path = plot_log(log, out or os.path.join(run_dir, CURVES),
                    f"{os.path.basename(os.path.abspath(run_dir))}: "
                    f"{len(log.epochs)} epoch{'s' if len(log.epochs) != 1 else ''}")
    return {"run": run_dir, "log": log.path, "curves": path, "epochs": len(log.epochs),
            "best_epoch": best,
            "best_val_accuracy": None if best is None else log.values["val_accuracy"][best - 1],
            "columns": [name for name in DRAWN if name in log.values]}
