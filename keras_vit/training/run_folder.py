"""The output folder of `train`: which run owns it, and one writer at a time.

A run folder (`--out`) holds one run: `run.json` (the run record: every
argument that changes the result, the data's class names and image
counts, when the run started, its status), `backup/` (what a killed run
resumes from), `best.keras`, `best.keras.json`, `log.csv`, `labels.txt`,
`tensorboard/`, `model.keras` and the pictures drawn at its end
(`curves.png`, `confusion_matrix.png`). `open_run_folder` decides what a new
`train` call may do with a folder:

- empty, or without any of those files: a new run;
- the same record with a backup: resume after the backup's epoch;
- the same record without a backup (killed before its first epoch
  ended): start again;
- a backup, log or best-epoch record that is unreadable or contradicts
  the others (`read_backup`, the one reader of a backup): one ValueError
  naming the file (a damaged record is a damaged run, never a new one);
- anything else (another run's record, a finished run, a folder of run
  files without a record): one ValueError naming what the folder holds;
  `overwrite=True` (`--overwrite`) removes the run's files (nothing
  else in the folder) and starts afresh.

A lock (an OS file lock, as the weight downloads use) keeps a second
`train` process out of a folder that a live one is writing.

Example:

```python
with open_run_folder("runs/flowers", record) as folder:
    print(folder.describe())        # "new run" or "resuming at epoch 3 of 10 ..."
    ...                             # model.fit(...)
    folder.finish("completed")
```
"""

import contextlib
import csv
import dataclasses
import datetime
import json
import logging
import math
import os
import shutil
import stat

import filelock

from keras_vit import _atomic

logger = logging.getLogger("keras_vit")

RECORD = "run.json"
LOCK = ".run.lock"
RUN_FILES = ("backup", "best.keras", "best.keras.json", "log.csv", "labels.txt",
             "tensorboard", "model.keras", "curves.png", "confusion_matrix.png", RECORD)


def _normalized(value):
    """`value` as JSON would give it back (tuples -> lists, keys -> str)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def describe_config(config):
    """`data folder:X, 10 classes 0..9`: what a person recognises a run by."""
    names = config.get("class_names") or []
    classes = (f"{len(names)} classes {names[0]}..{names[-1]}" if len(names) > 1 else
               f"{len(names)} class {names[0]}" if names else "no classes")
    model = config.get("model")
    if isinstance(model, dict):  # a .keras file or a keras.Model
        model = os.path.basename(model["file"]) if "file" in model else model.get("name")
    return f"model {model}, data {config.get('data')}, {classes}"


# What a person tells runs apart by first; the other keys follow by name.
_ORDER = ("model", "weights", "data", "class_names", "train_split", "validation_split",
          "images", "recipe")


def _first_difference(old, new):
    keys = set(old) | set(new)
    for key in [k for k in _ORDER if k in keys] + sorted(keys - set(_ORDER)):
        if old.get(key) != new.get(key):
            return key, old.get(key), new.get(key)
    return None


def _shorten(value, limit=80):
    if isinstance(value, dict) and "sha256" in value:  # a .keras file: whole
        return repr(f"{value.get('file')} (SHA-256 {value['sha256'][:12]}...)")
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclasses.dataclass
class RunFolder:
    """The folder a `train` call writes, while it holds the lock.

    `resumed_epoch`: completed epochs the backup holds (0 for a new run);
    `started`: when the run (the first of its resumes) started."""

    path: str
    config: dict
    started: str
    resumed_epoch: int = 0
    epochs: int = None

    def describe(self):
        if not self.resumed_epoch:
            return f"new run (record: {os.path.join(self.path, RECORD)})"
        total = f" of {self.epochs}" if self.epochs else ""
        return (f"resuming at epoch {self.resumed_epoch + 1}{total} of the run started "
                f"{self.started} ({self.resumed_epoch} done, from {self.path}/backup)")

    def write(self, status, **extra):
        """Writes `run.json` (atomically) with `status`."""
        record = {"status": status, "started": self.started, "updated": _now(),
                  "pid": os.getpid(), "config": self.config, **extra}
        _atomic.write_text(os.path.join(self.path, RECORD), json.dumps(record, indent=1))

    def finish(self, status, **extra):
        """Marks the run `"completed"` or `"diverged"`: a later call with
        the same record then needs `overwrite=True` (or another folder)."""
        self.write(status, **extra)


def read_record(path):
    """The run record in folder `path`, or None when there is none; a
    record that cannot be read is a ValueError naming it."""
    file = os.path.join(path, RECORD)
    if not os.path.exists(file):
        return None
    try:
        with open(file, encoding="utf-8") as f:
            record = json.load(f)
        if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
            raise ValueError("not a run record")
    except (OSError, ValueError) as error:
        raise ValueError(f"{file} cannot be read as a run record ({error}); pass --out NEW "
                         "or --overwrite (train(..., overwrite=True)).") from None
    return record


BACKUP = "backup"
METADATA = "training_metadata.json"   # Keras' BackupAndRestore: {"epoch": N, "batch": 0}
BACKUP_WEIGHTS = "latest.weights.h5"  # Keras' BackupAndRestore: the weights of epoch N
_SMALL_FILE = 1 << 20  # more than any record a run writes (bytes)


@dataclasses.dataclass(frozen=True)
class Backup:
    """What a run folder's backup says, checked by `read_backup`.

    `epoch`: completed epochs the backup holds (0: no backup); `best`:
    `best.keras.json` (`{"monitor", "value", "epoch"}`) when it was asked
    for and is there; `logged`: the epochs `log.csv` records (None when
    not asked for)."""

    epoch: int = 0
    best: dict = None
    logged: int = None


class DamagedRunError(ValueError):
    """A file of a run folder contradicts the rest of the run: resuming
    from it would train from the wrong weights or the wrong epoch."""


def damaged(file, why):
    """Raises the DamagedRunError of run file `file`: `why` says what is wrong."""
    raise DamagedRunError(
        f"{file} {why}, so the run cannot be resumed from it; pass --overwrite "
        "(train(..., overwrite=True)) to start the run afresh, or --out NEW.")


def _read_json(file, what):
    """The JSON object in regular file `file` (at most 1 MiB), or a
    DamagedRunError naming it."""
    try:
        with open(file, "rb", opener=lambda name, flags: os.open(
                name, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ValueError("not a regular file")
            data = f.read(_SMALL_FILE + 1)
        if len(data) > _SMALL_FILE:
            raise ValueError(f"more than {_SMALL_FILE:,} bytes")
        value = json.loads(data)
        if not isinstance(value, dict):
            raise ValueError(f"a JSON {type(value).__name__}, not an object")
    except (OSError, ValueError, UnicodeDecodeError) as error:
        damaged(file, f"cannot be read as {what} ({error})")
    return value


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _log_rows(file):
    """The rows of `log.csv` (its `epoch` column: 1, 2, ... N), or a
    DamagedRunError naming it."""
    try:
        with open(file, encoding="utf-8", newline="") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ValueError("not a regular file")
            rows = list(csv.DictReader(f))
        epochs = [int(row["epoch"]) for row in rows]
    except (OSError, ValueError, KeyError, TypeError, csv.Error) as error:
        damaged(file, f"cannot be read as the run's log ({error})")
    if epochs != list(range(1, len(epochs) + 1)):
        damaged(file, f"records epochs {_shorten(epochs)}, not 1, 2, 3, ... in order")
    return rows


def _check_best(file, epoch, rows):
    """`best.keras.json`, checked against the backup's `epoch` and the
    log's `rows` (None: no log to check against)."""
    best = _read_json(file, "the best epoch's record")
    value, at = best.get("value"), best.get("epoch")
    if not isinstance(best.get("monitor"), str):
        damaged(file, f"names no monitored metric (monitor {_shorten(best.get('monitor'))})")
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)
            and (0 <= value <= 1 or not best["monitor"].endswith("accuracy"))):
        damaged(file, f"says the best {best['monitor']} is {_shorten(value)}, not a finite "
                       "value of that metric")
    if not (_whole(at) and 1 <= at <= epoch):
        damaged(file, f"says the best epoch is {_shorten(at)}, but the backup holds "
                       f"{epoch} finished epochs (the best is one of 1..{epoch})")
    if not os.path.isfile(os.path.join(os.path.dirname(file), os.path.basename(file)[:-5])):
        damaged(file, f"describes {os.path.basename(file)[:-5]}, which is not there")
    if rows is not None and at <= len(rows):
        try:
            logged = float(rows[at - 1][best["monitor"]])
        except (KeyError, TypeError, ValueError):
            logged = None
        if logged is None or not math.isclose(logged, value, rel_tol=1e-6, abs_tol=1e-7):
            damaged(file, f"says the best {best['monitor']} is {value!r} at epoch {at}, but "
                           f"log.csv records {logged!r} for that epoch")
    return best


def read_backup(backup_dir, epochs=None, *, log=None, best=None):
    """The one reader of a run's backup (`BackupAndRestore`'s
    `training_metadata.json` and `latest.weights.h5`): a `Backup`, checked.

    The backup's epoch is a whole number in 1..`epochs`-1 (a backup of
    the last epoch, or beyond it, would report a finished run with the
    weights of an earlier one), and the weights file is there. `log`
    (`log.csv`, which `EpochLogger` writes before the backup): its epochs
    are 1..N with N the backup's epoch or the one after (killed between
    the two). `best` (`best.keras.json`, written after the backup): its
    value finite and its epoch at most the backup's. No backup at all
    (`backup_dir` absent, or empty): `Backup(0)`.

    Raises:
        DamagedRunError (a ValueError): any of those files is unreadable
            or contradicts the others; one sentence naming the file and
            suggesting `--overwrite`.
    """
    metadata = os.path.join(backup_dir, METADATA)
    weights = os.path.join(backup_dir, BACKUP_WEIGHTS)
    rows = None if log is None or not os.path.lexists(log) else _log_rows(log)
    logged = None if rows is None else len(rows)
    if os.path.lexists(backup_dir) and (os.path.islink(backup_dir)
                                        or not os.path.isdir(backup_dir)):
        damaged(backup_dir, "is not a folder")
    if not os.path.lexists(metadata):
        if os.path.lexists(weights):
            damaged(backup_dir, f"holds {BACKUP_WEIGHTS} but no {METADATA} (which epoch "
                                 "the weights are of)")
        return Backup(0, None, logged)
    epoch = _read_json(metadata, "a backup record").get("epoch")
    if not _whole(epoch):
        damaged(metadata, f"gives the finished epochs as {_shorten(epoch)}, not a whole "
                           "number")
    last = "" if epochs is None else f"..{epochs - 1}"
    if epoch < 1 or (epochs is not None and epoch > epochs - 1):
        damaged(metadata, f"says {epoch} epochs are finished, but a run of {epochs} epochs "
                           f"resumes only after epoch 1{last}")
    if not os.path.isfile(weights) or os.path.islink(weights):
        damaged(backup_dir, f"holds no {BACKUP_WEIGHTS} (the weights of epoch {epoch})")
    if log is not None and logged not in (epoch, epoch + 1):
        damaged(log, f"records {logged or 0} finished epochs, but {metadata} says {epoch}")
    state = None
    if best is not None and os.path.lexists(best):
        state = _check_best(best, epoch, rows)
    return Backup(epoch, state, logged)


def clear_run_files(path):
    """Removes the run's files from `path` (only those: see `RUN_FILES`);
    returns the names removed."""
    removed = []
    for name in RUN_FILES:
        target = os.path.join(path, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        elif os.path.lexists(target):
            os.remove(target)
        else:
            continue
        removed.append(name)
    return removed


def _refuse(path, why):
    raise ValueError(f"{path} {why}; pass --out NEW or --overwrite "
                     "(train(..., out=NEW) or overwrite=True).")


def _decide(path, config, overwrite, epochs):
    """The RunFolder for a new or resumed run in `path` (locked), or a
    ValueError saying what the folder holds."""
    present = [name for name in RUN_FILES if os.path.lexists(os.path.join(path, name))]
    if overwrite and present:
        removed = clear_run_files(path)
        logger.warning("--overwrite: removed %s from %s; starting a new run.",
                       ", ".join(removed), path)
        present = []
    record = read_record(path)
    if not present:
        return RunFolder(path, config, _now(), 0, epochs)
    if record is None:
        _refuse(path, f"holds the files of a run without a run record ({', '.join(present)}; "
                      f"no {RECORD}: an earlier keras_vit or another program wrote them)")
    old = record["config"]
    what = describe_config(old)
    difference = _first_difference(old, config)
    if difference is not None:
        key, before, now = difference
        _refuse(path, f"holds a different run ({what}; its {key} is {_shorten(before)}, "
                      f"this run's is {_shorten(now)})")
    status = record.get("status")
    if status in ("completed", "diverged"):
        _refuse(path, f"holds a {status} run of the same configuration ({what}, started "
                      f"{record.get('started')})")
    log, best = os.path.join(path, "log.csv"), os.path.join(path, "best.keras")
    backup = read_backup(os.path.join(path, BACKUP), epochs, log=log, best=best + ".json")
    if not backup.epoch:  # killed before its first backup: nothing to resume
        if (backup.logged or 0) > 1 or os.path.lexists(best):
            damaged(log if backup.logged else best,
                     f"holds {backup.logged or 'some'} finished epochs of the run, but there "
                     f"is no backup ({os.path.join(path, BACKUP, METADATA)}) of them")
        clear_run_files(path)
        logger.warning("%s holds a run of the same configuration that stopped before its "
                       "first epoch ended; starting it again.", path)
        return RunFolder(path, config, _now(), 0, epochs)
    if backup.logged > backup.epoch:  # killed after the log's row, before the backup
        with open(log, encoding="utf-8", newline="") as f:
            lines = f.read().splitlines(keepends=True)
        _atomic.write_text(log, "".join(lines[:1 + backup.epoch]))
    return RunFolder(path, config, record.get("started") or _now(), backup.epoch, epochs)


@contextlib.contextmanager
def open_run_folder(path, config, *, overwrite=False, epochs=None):
    """Locks run folder `path` for this process and yields its `RunFolder`
    (written as `"running"` before the first step); see the module's
    docstring for what is allowed.

    Raises:
        ValueError: another process holds the folder, or the folder holds
            another run (a different record, a finished run, run files
            without a record) and `overwrite` is False.
    """
    os.makedirs(path, exist_ok=True)
    config = _normalized(config)
    lock = filelock.FileLock(os.path.join(path, LOCK), timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        owner = {}
        with contextlib.suppress(OSError, ValueError, AttributeError):
            owner = read_record(path) or {}
        who = (f" (pid {owner.get('pid')}, started {owner.get('started')})"
               if owner.get("pid") else "")
        raise ValueError(f"Another keras-vit train process is writing to {path}{who}; wait "
                         "for it to finish, or pass --out NEW.") from None
    try:
        folder = _decide(path, config, overwrite, epochs)
        folder.write("running")
        try:
            yield folder
        except BaseException:
            _forget_if_unstarted(path)
            raise
    finally:
        lock.release()


# What a run leaves before the end of its first epoch: its record, and the
# log and TensorBoard files Keras' callbacks open when training begins.
_BEFORE_FIRST_EPOCH = {RECORD, "log.csv", "tensorboard"}


def _forget_if_unstarted(path):
    """After a run stopped by an error (a refusal before the first step, a
    corrupt image, Ctrl-C) before any epoch ended: removes what it wrote
    (its "running" record, the empty log), so that the folder takes a
    corrected run without --overwrite, as an empty one would. A run with
    anything to resume from or to look at (a backup, best.keras, a
    finished record) keeps all of it."""
    present = {name for name in RUN_FILES if os.path.lexists(os.path.join(path, name))}
    record = {}
    with contextlib.suppress(ValueError):  # (the run's own error is the one to raise)
        record = read_record(path) or {}
    if present <= _BEFORE_FIRST_EPOCH and record.get("status") == "running":
        clear_run_files(path)
