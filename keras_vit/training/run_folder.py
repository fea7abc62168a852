"""The output folder of `train`: which run owns it, and one writer at a time.

A run folder (`--out`) holds one run: `run.json` (the run record: every
argument that changes the result, the data's class names and image
counts, when the run started, its status), `backup/` (what a killed run
resumes from), `best.keras`, `best.keras.json`, `log.csv`, `labels.txt`,
`tensorboard/` and `model.keras`. `open_run_folder` decides what a new
`train` call may do with a folder:

- empty, or without any of those files: a new run;
- the same record with a backup: resume after the backup's epoch;
- the same record without a backup (killed before its first epoch
  ended): start again;
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
import dataclasses
import datetime
import json
import logging
import os
import shutil

import filelock

logger = logging.getLogger("keras_vit")

RECORD = "run.json"
LOCK = ".run.lock"
RUN_FILES = ("backup", "best.keras", "best.keras.json", "log.csv", "labels.txt",
             "tensorboard", "model.keras", RECORD)


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
        temporary = os.path.join(self.path, f".{RECORD}.tmp-{os.getpid()}")
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
        os.replace(temporary, os.path.join(self.path, RECORD))

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


def _backup_epoch(path):
    """Completed epochs in the folder's Keras backup (0: no backup)."""
    metadata = os.path.join(path, "backup", "training_metadata.json")
    try:
        with open(metadata, encoding="utf-8") as f:
            return int(json.load(f).get("epoch", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


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
    resumed = _backup_epoch(path)
    if not resumed:  # killed before its first backup: nothing to resume
        clear_run_files(path)
        logger.warning("%s holds a run of the same configuration that stopped before its "
                       "first epoch ended; starting it again.", path)
        return RunFolder(path, config, _now(), 0, epochs)
    return RunFolder(path, config, record.get("started") or _now(), resumed, epochs)


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
    if (present <= _BEFORE_FIRST_EPOCH and not _backup_epoch(path)
            and record.get("status") == "running"):
        clear_run_files(path)
