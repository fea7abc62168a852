"""`python -m tf_records build`: write shards in parallel processes.

Each shard is written by one worker process (with `--workers 1`, or one
shard left to write, by the build process itself: no process to start and
no second TensorFlow import) under a temporary name
(`.<shard>.tmp-<pid>`) and renamed to `<split>-<i>-of-<n>` only when it is
complete, so an interrupted build never leaves a complete-looking partial
shard.

Before its first shard a build writes `<split>.manifest.json`
(`tf_records.manifest`): the source, --seed, --num-shards, the class names
and every source file (name, size, mtime; for TFDS the dataset's name,
version and size). Re-running the same command resumes: temporary files of
dead runs are removed, each finished shard is read in full (record CRCs)
and kept when it holds the records the manifest gives it, the missing
shards are written. A run whose arguments or source differ from the
manifest, shards without a manifest (an older build) and a damaged finished
shard stop with one sentence naming the difference and the remedy;
`--overwrite` rebuilds everything. A full disk stops the build with one
sentence naming the file; an interrupted or failed build removes its
partial shards and records its finished ones, so that re-running the same
command resumes.

Workers exit when the build process dies (each polls its parent) or fails,
so a killed build leaves no process behind. Paths go through `tf.io.gfile`,
so `gs://` works.
"""

import contextlib
import errno
import json
import multiprocessing
import os
import queue
import random
import re
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from tf_records import manifest

# Fault-injection hook for the tests: seconds to sleep after each record.
SLOW_WRITE_ENV = "KERAS_VIT_TFRECORDS_SLOW_WRITE"
_POLL = 0.2  # seconds between a worker's checks of its parent and progress reports


def plan(source, split, data_dir=None, seed=0):
    """Returns `(kind, examples_or_name, class_names, num_examples)`."""
    from keras_vit.data.sources import list_folder, parse_source, tfds_source

    scheme, rest = parse_source(source)
    if scheme == "folder":
        files, labels, classes = list_folder(rest, split)
        examples = list(zip(files, labels, strict=True))
        random.Random(seed).shuffle(examples)  # mix classes across shards
        return "folder", examples, classes, len(examples)
    if scheme == "tfds":
        src = tfds_source(rest, split, data_dir)
        return "tfds", rest, src.class_names, src.num_examples
    raise ValueError(
        f"`build` reads 'folder:' and 'tfds:' sources, got {source!r}; a "
        "'tfrecord:' source is already in this format."
    )


def _tfds_builder(name, data_dir):
    import tensorflow_datasets as tfds

    name, _, version = name.partition(":")
    return tfds.builder(f"{name}:{version}" if version else name, data_dir=data_dir)


def _tfds_facts(name, split, num_shards, data_dir, total):
    """`(manifest["tfds"], examples of each shard)`; a count is None if unknown."""
    import tensorflow_datasets as tfds

    builder = _tfds_builder(name, data_dir)
    try:
        counts = [builder.info.splits[part].num_examples
                  for part in tfds.even_splits(split, n=num_shards)]
    except Exception:  # noqa: BLE001 (TFDS raises several kinds)
        counts = [None] * num_shards
    return ({"name": builder.name, "version": str(builder.info.version), "split": split,
             "num_examples": total}, counts)


def _image_info(tf, data):
    """(format, height, width) of encoded image bytes; raises if corrupt."""
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
    kind = ("JPEG" if tf.io.is_jpeg(data).numpy() else
            "PNG" if data[:8] == b"\x89PNG\r\n\x1a\n" else
            "GIF" if data[:4] == b"GIF8" else "BMP" if data[:2] == b"BM" else "UNKNOWN")
    return kind, int(image.shape[0]), int(image.shape[1])


def _records(tf, task):
    """Yields `(encoded, label, filename)` of one shard's examples."""
    if task["kind"] == "folder":
        for path, label in task["examples"]:
            with tf.io.gfile.GFile(path, "rb") as f:
                yield f.read(), label, manifest.record_name(path)
        return
    import tensorflow_datasets as tfds

    builder = _tfds_builder(task["name"], task["data_dir"])
    subsplit = tfds.even_splits(task["split"], n=task["num_shards"])[task["index"]]
    dataset = builder.as_dataset(split=subsplit, shuffle_files=False,
                                 decoders={"image": tfds.decode.SkipDecoding()})
    for i, example in enumerate(dataset.as_numpy_iterator()):
        filename = example.get("file_name", b"") or f"{task['split']}[{task['index']}]#{i}".encode()
        if isinstance(filename, bytes):
            filename = filename.decode("utf-8", "replace")
        yield example["image"], int(example["label"]), filename


# In a worker process: the progress queue, the stop event and the pid of the
# build process (set by `_init_worker`).
_worker = {}


def _init_worker(progress, stop, parent):
    """Pool initializer: a daemon thread ends this worker when the build
    process dies (its parent pid changes) or sets `stop`, so no worker
    outlives or keeps writing behind a killed or failed build."""
    _worker.update(progress=progress, stop=stop, parent=parent)
    threading.Thread(target=_watch, daemon=True).start()


def _orphaned():
    """Whether this worker's build died or failed (`parent` None: the shard
    is written in the build process itself, which never orphans itself)."""
    parent = _worker["parent"]
    return (parent is not None and os.getppid() != parent) or _worker["stop"].is_set()


def _watch():
    while not _orphaned():
        time.sleep(_POLL)
    os._exit(1)


def write_shard(task):
    """Worker: writes one shard atomically. Returns a result dict."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from keras_vit.data import schema

    delay = float(os.environ.get(SLOW_WRITE_ENV, "0") or 0)
    final = task["final"]
    tmp = os.path.join(os.path.dirname(final),
                       f".{os.path.basename(final)}.tmp-{os.getpid()}")
    written, skipped, unreported, reported = 0, [], 0, time.monotonic()
    classes = task["class_names"]
    with tf.io.TFRecordWriter(tmp) as writer:
        for data, label, filename in _records(tf, task):
            unreported += 1
            if time.monotonic() - reported >= _POLL:
                _worker["progress"].put(unreported)
                unreported, reported = 0, time.monotonic()
            try:
                kind, height, width = _image_info(tf, data)
            except (tf.errors.InvalidArgumentError, ValueError) as error:
                reason = str(error).splitlines()[0]
                if not task["skip_corrupt"]:
                    writer.close()
                    tf.io.gfile.remove(tmp)
                    return {"shard": final,
                            "error": f"Corrupt or non-image file {filename}: {reason}"}
                skipped.append([filename, reason])
                continue
            writer.write(schema.encode_example(
                data, label, image_format=kind, text=classes[label],
                filename=filename, height=height, width=width))
            written += 1
            if delay:
                time.sleep(delay)
    _worker["progress"].put(unreported)
    if _orphaned():  # the build died or failed meanwhile: leave no final shard
        os._exit(1)
    tf.io.gfile.rename(tmp, final, overwrite=True)
    return {"shard": final, "examples": written, "skipped": skipped}


def _shard_tasks(kind, payload, class_names, split, out, num_shards, data_dir,
                 skip_corrupt, tfds_counts=None):
    from keras_vit.data.schema import shard_name

    tasks = []
    for index in range(num_shards):
        task = {
            "kind": kind, "index": index, "num_shards": num_shards, "split": split,
            "final": os.path.join(out, shard_name(split, index, num_shards)),
            "class_names": class_names, "data_dir": data_dir,
            "skip_corrupt": skip_corrupt,
        }
        if kind == "folder":
            task["examples"] = payload[index::num_shards]
            task["expected"] = len(task["examples"])
        else:
            task["name"], task["expected"] = payload, tfds_counts[index]
        tasks.append(task)
    return tasks


def tf_error_text(error):
    """The first line of a TensorFlow error, without its op decorations."""
    return re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:.*$", "", error.message.splitlines()[0])


def _read_shard(tf, path):
    """`(records, None)` of a shard read in full (which checks every record's
    CRC), or `(None, why)` when it cannot be read."""
    try:
        return int(tf.data.TFRecordDataset(path).reduce(
            tf.constant(0, tf.int64), lambda n, _: n + 1)), None
    except tf.errors.OpError as error:
        return None, tf_error_text(error)


def _resumable(tf, tasks, existing, old, out, split):
    """`(finished, todo)`: the manifest records of the finished shards that
    pass `_read_shard` with the count their manifest gives them, and the
    tasks left to write. Raises OSError naming the damaged shards."""
    records = old.get("shards", {}) if old else {}
    finished, todo, damaged = {}, [], []
    for task in tasks:
        name = os.path.basename(task["final"])
        if task["final"] not in existing:
            todo.append(task)
            continue
        count, why = _read_shard(tf, task["final"])
        record = records.get(name)
        expected = record["examples"] if record else task["expected"]
        if why or (record and count != expected):
            damaged.append(f"{name} ({why or f'{count} records, its manifest says {expected}'})")
        elif count == expected:
            finished[name] = record or {"examples": count, "skipped": []}
        else:  # renamed by a worker of a build killed before it recorded the shard
            todo.append(task)
    if damaged:
        raise OSError(
            f"Damaged finished {split} shard(s) in {out}: {', '.join(damaged)}; delete "
            "them and rerun the same command to rewrite them, or pass --overwrite to "
            "start over.")
    return finished, todo


def _write_shards(todo, workers, bar, record):
    """Runs `write_shard` over `todo` in worker processes, calls `record`
    with each result as it comes, returns the errors (corrupt files)."""
    if min(workers, len(todo)) == 1:
        return _write_here(todo, bar, record)
    context = multiprocessing.get_context("spawn")
    progress, stop = context.Queue(), context.Event()
    pool = ProcessPoolExecutor(min(workers, len(todo)), mp_context=context,
                               initializer=_init_worker,
                               initargs=(progress, stop, os.getpid()))
    errors, done = [], 0
    try:
        pending = {pool.submit(write_shard, task) for task in todo}
        while pending or not progress.empty():
            try:
                done += progress.get(timeout=_POLL)
                if bar:
                    bar.update(done)
            except queue.Empty:
                pass
            finished = [f for f in pending if f.done()]
            pending.difference_update(finished)
            for future in sorted(finished, key=lambda f: f.exception() is not None):
                result = future.result()
                if "error" in result:
                    errors.append(result["error"])
                else:
                    record(result)
    except BaseException as error:
        stop.set()  # the workers exit now instead of finishing their shards
        if isinstance(error, BrokenProcessPool):
            raise OSError(
                "A worker process died while writing (killed or out of memory). "
                "Finished shards are kept and no partial shard has a final name: "
                "re-run the same command to resume."
            ) from None
        raise
    finally:
        pool.shutdown(cancel_futures=True)
    return errors


class _Progress:
    """The progress queue of `_write_here`: what a worker puts moves the bar."""

    def __init__(self, bar):
        self.bar, self.done = bar, 0

    def put(self, count):
        self.done += count
        if self.bar:
            self.bar.update(self.done)


def _write_here(todo, bar, record):
    """`_write_shards` with one worker: the shards one after the other in
    this process (a KeyboardInterrupt or a full disk reaches `_build`
    directly, which removes the partial shard)."""
    _worker.update(progress=_Progress(bar), stop=threading.Event(), parent=None)
    errors = []
    try:
        for task in todo:
            result = write_shard(task)
            if "error" in result:
                errors.append(result["error"])
            else:
                record(result)
    finally:
        _worker.clear()
    return errors


def _disk_full(error):
    """Whether `error` (an OSError, or TensorFlow's error from a write) says
    the disk or the user's quota is full."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "No space left on device" in str(error)


def resume_advice(overwrite):
    """How to resume a stopped build: the same command, less --overwrite
    (with which it would start over)."""
    if overwrite:
        return ("re-run the same command without --overwrite to resume (with it, the "
                "build starts over)")
    return "re-run the same command to resume"


def _disk_full_message(error, out, split, overwrite=False):
    """One sentence for a full disk: the file being written (a shard's
    temporary named as the shard it was to become), what is kept, what to do."""
    filename = getattr(error, "filename", None)
    found = re.match(r"(.+?); No space left on device", str(error).strip())
    path = os.fsdecode(filename) if filename else found.group(1) if found else out
    folder, name = os.path.split(path)
    temporary = re.fullmatch(r"\.(.+)\.tmp-\d+", name)
    if temporary:
        path = (manifest.manifest_path(out, split) if temporary.group(1).endswith("-manifest")
                else os.path.join(folder, temporary.group(1)))
    return (f"No space left on device writing {path!r}: the finished {split} shards in "
            f"{out} are kept and no partial shard has a final name; free some space and "
            f"{resume_advice(overwrite)}.")


def _remove_partial_shards(tf, out, split):
    """Removes the temporaries of `split`'s shards in `out` (of a build that
    stopped); never raises."""
    with contextlib.suppress(Exception):
        for path in tf.io.gfile.glob(os.path.join(out, f".{split}-*.tmp-*")):
            with contextlib.suppress(Exception):
                tf.io.gfile.remove(path)


def build(source, split, out, num_shards, workers, data_dir=None,
          skip_corrupt=False, overwrite=False, seed=0, verbose=True):
    """Writes the shards of one split and its manifest, updates
    `dataset_info.json`.

    Returns a summary dict (examples, shards written and reused, skipped
    corrupt files, those of reused shards included). Raises ValueError
    naming the first corrupt file unless `skip_corrupt`, ValueError when the
    shards in `out` belong to another build (module docstring), OSError
    naming damaged finished shards, OSError (errno ENOSPC) naming the file
    being written when the disk is full.
    """
    try:
        return _build(source, split, out, num_shards, workers, data_dir, skip_corrupt,
                      overwrite, seed, verbose)
    except Exception as error:
        if not _disk_full(error):
            raise
        full = OSError(_disk_full_message(error, out, split, overwrite))
        full.errno = errno.ENOSPC
        raise full from None


def _build(source, split, out, num_shards, workers, data_dir, skip_corrupt, overwrite,
           seed, verbose):
    """`build`, without the full disk's sentence."""
    import keras
    import tensorflow as tf

    from keras_vit.data import schema
    from keras_vit.data.sources import read_info

    for name, value in (("num_shards", num_shards), ("workers", workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive int, got {value!r}.")
    kind, payload, class_names, total = plan(source, split, data_dir, seed)
    if total is not None and num_shards > total:
        raise ValueError(f"--num-shards {num_shards} is more than the {total} examples of "
                         f"{source} ({split}); give at most {total}, so that no shard is empty.")
    facts, counts = _tfds_facts(payload, split, num_shards, data_dir, total) \
        if kind == "tfds" else (None, None)
    new = manifest.describe(source, split, seed, num_shards, class_names, tfds=facts,
                            files=None if facts else [path for path, _ in payload])
    tasks = _shard_tasks(kind, payload, class_names, split, out, num_shards, data_dir,
                         skip_corrupt, counts)
    tf.io.gfile.makedirs(out)
    for path in tf.io.gfile.glob(os.path.join(out, f".{split}-*.tmp-*")):
        tf.io.gfile.remove(path)  # leftovers of an interrupted run
    existing = set(tf.io.gfile.glob(os.path.join(out, f"{split}-*-of-*")))
    if overwrite:
        for path in existing:
            tf.io.gfile.remove(path)
        existing = set()
    old = manifest.read(out, split) if existing else None
    if existing and old is None:
        raise ValueError(
            f"{out} holds {split} shards but no {split}.manifest.json (written by an older "
            "tf_records build or another tool), so they cannot be checked against this "
            "source; pass --overwrite to rebuild them.")
    problem = old and manifest.difference(old, new, f"the {split} shards in {out}")
    if problem:
        raise ValueError(problem)
    foreign = sorted(os.path.basename(p) for p in existing - {t["final"] for t in tasks})
    if foreign:
        raise ValueError(f"{out} holds {split} shards that its manifest does not plan "
                         f"({', '.join(foreign)}); remove them or pass --overwrite to start over.")
    finished, todo = _resumable(tf, tasks, existing, old, out, split)
    new["shards"] = finished
    manifest.write(out, split, new)  # before any shard

    def record(result):
        finished[os.path.basename(result["shard"])] = {
            "examples": result["examples"], "skipped": result["skipped"]}

    errors = []
    if todo:
        remaining = None if any(t["expected"] is None for t in todo) \
            else sum(t["expected"] for t in todo)
        bar = keras.utils.Progbar(remaining, unit_name="image") if verbose else None
        stopped = True
        try:
            errors = _write_shards(todo, workers, bar, record)
            stopped = False
        finally:  # records the shards finished, also when the build fails
            new["shards"] = dict(sorted(finished.items()))
            if stopped:  # keep the error that stopped it (a full disk fails this too)
                _remove_partial_shards(tf, out, split)
                with contextlib.suppress(Exception):
                    manifest.write(out, split, new)
            else:
                manifest.write(out, split, new)
    if errors:
        raise ValueError(
            f"{errors[0]}. Pass --skip-corrupt to skip and count such files "
            f"({len(errors)} shard(s) stopped).")
    finished = dict(sorted(finished.items()))
    counts = {name: r["examples"] for name, r in finished.items()}
    skipped = [f"{name}: {why}" for r in finished.values() for name, why in r["skipped"]]

    info = read_info(out) or {}
    info.setdefault("splits", {})
    info["splits"][split] = {
        "num_examples": sum(counts.values()), "num_shards": num_shards,
        "shard_examples": counts,
    }
    info["class_names"] = class_names
    info["num_classes"] = len(class_names)
    info.setdefault("sources", {})[split] = source
    with tf.io.gfile.GFile(os.path.join(out, schema.INFO_FILE), "w") as f:
        json.dump(info, f, indent=1)
    return {
        "out": out, "split": split, "num_examples": sum(counts.values()),
        "num_shards": num_shards, "shards_written": len(todo),
        "shards_reused": len(tasks) - len(todo), "skipped_corrupt": len(skipped),
        "skipped_files": skipped, "class_names": class_names,
    }
