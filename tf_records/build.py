"""`python -m tf_records build`: write shards in parallel processes.

Each shard is written by one worker process under a temporary name
(`.<shard>.tmp-<pid>`) and renamed to `<split>-<i>-of-<n>` only when it is
complete, so an interrupted build never leaves a complete-looking partial
shard. Re-running the same command resumes: finished shards are kept,
temporary files of dead runs are removed, the missing shards are written.
`--overwrite` rebuilds everything. Paths go through `tf.io.gfile`, so
`gs://` works.
"""

import json
import multiprocessing
import os
import queue
import random
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

# Fault-injection hook for the tests: seconds to sleep after each record.
SLOW_WRITE_ENV = "KERAS_VIT_TFRECORDS_SLOW_WRITE"


def plan(source, split, data_dir=None, seed=0):
    """Returns `(kind, examples_or_name, class_names, num_examples)`."""
    from keras_vit.data.sources import list_folder, parse_source, tfds_source

    scheme, rest = parse_source(source)
    if scheme == "folder":
        files, labels, classes = list_folder(rest, split)
        examples = list(zip(files, labels))
        random.Random(seed).shuffle(examples)  # mix classes across shards
        return "folder", examples, classes, len(examples)
    if scheme == "tfds":
        src = tfds_source(rest, split, data_dir)
        return "tfds", rest, src.class_names, src.num_examples
    raise ValueError(
        f"`build` reads 'folder:' and 'tfds:' sources, got {source!r}; a "
        "'tfrecord:' source is already in this format."
    )


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
                yield f.read(), label, path
        return
    import tensorflow_datasets as tfds

    name, _, version = task["name"].partition(":")
    builder = tfds.builder(f"{name}:{version}" if version else name,
                           data_dir=task["data_dir"])
    subsplit = tfds.even_splits(task["split"], n=task["num_shards"])[task["index"]]
    dataset = builder.as_dataset(split=subsplit, shuffle_files=False,
                                 decoders={"image": tfds.decode.SkipDecoding()})
    for i, example in enumerate(dataset.as_numpy_iterator()):
        filename = example.get("file_name", b"") or f"{task['split']}[{task['index']}]#{i}".encode()
        if isinstance(filename, bytes):
            filename = filename.decode("utf-8", "replace")
        yield example["image"], int(example["label"]), filename


def _record_name(path):
    """`<class folder>/<file>` for folder sources (unique), else as given."""
    parent = os.path.basename(os.path.dirname(path))
    return f"{parent}/{os.path.basename(path)}" if parent else path


def write_shard(task, progress):
    """Worker: writes one shard atomically. Returns a result dict."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from keras_vit.data import schema

    delay = float(os.environ.get(SLOW_WRITE_ENV, "0") or 0)
    final = task["final"]
    tmp = os.path.join(os.path.dirname(final),
                       f".{os.path.basename(final)}.tmp-{os.getpid()}")
    written, skipped = 0, []
    classes = task["class_names"]
    with tf.io.TFRecordWriter(tmp) as writer:
        for data, label, filename in _records(tf, task):
            try:
                kind, height, width = _image_info(tf, data)
            except (tf.errors.InvalidArgumentError, ValueError) as error:
                message = f"{filename}: {str(error).splitlines()[0]}"
                if not task["skip_corrupt"]:
                    writer.close()
                    tf.io.gfile.remove(tmp)
                    return {"shard": final, "error": f"Corrupt or non-image file {message}"}
                skipped.append(message)
                progress.put(1)
                continue
            writer.write(schema.encode_example(
                data, label, image_format=kind, text=classes[label],
                filename=_record_name(filename), height=height, width=width))
            written += 1
            progress.put(1)
            if delay:
                time.sleep(delay)
    tf.io.gfile.rename(tmp, final, overwrite=True)
    return {"shard": final, "examples": written, "skipped": skipped}


def _shard_tasks(kind, payload, class_names, split, out, num_shards, data_dir,
                 skip_corrupt):
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
        else:
            task["name"] = payload
        tasks.append(task)
    return tasks


def _count_records(tf, path):
    return sum(1 for _ in tf.data.TFRecordDataset(path))


def build(source, split, out, num_shards, workers, data_dir=None,
          skip_corrupt=False, overwrite=False, seed=0, verbose=True):
    """Writes the shards of one split and updates `dataset_info.json`.

    Returns a summary dict (examples, shards written and reused, skipped
    corrupt files). Raises ValueError naming the first corrupt file unless
    `skip_corrupt`.
    """
    import tensorflow as tf

    import keras
    from keras_vit.data import schema
    from keras_vit.data.sources import read_info

    for name, value in (("num_shards", num_shards), ("workers", workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive int, got {value!r}.")
    kind, payload, class_names, total = plan(source, split, data_dir, seed)
    tf.io.gfile.makedirs(out)
    pattern = f"{split}-*-of-*"
    for path in tf.io.gfile.glob(os.path.join(out, f".{split}-*.tmp-*")):
        tf.io.gfile.remove(path)  # leftovers of an interrupted run
    existing = set(tf.io.gfile.glob(os.path.join(out, pattern)))
    tasks = _shard_tasks(kind, payload, class_names, split, out, num_shards,
                         data_dir, skip_corrupt)
    wanted = {t["final"] for t in tasks}
    for stale in existing - wanted:  # shards of another --num-shards
        tf.io.gfile.remove(stale)
    if overwrite:
        for path in existing & wanted:
            tf.io.gfile.remove(path)
        existing = set()
    todo = [t for t in tasks if t["final"] not in existing]
    reused = [t["final"] for t in tasks if t["final"] in existing]
    counts = {path: _count_records(tf, path) for path in reused}

    results = []
    if todo:
        context = multiprocessing.get_context("spawn")
        manager = context.Manager()
        progress = manager.Queue()
        remaining = sum(len(t.get("examples", ())) for t in todo) if kind == "folder" \
            else int(total * len(todo) / num_shards) if total else None
        bar = keras.utils.Progbar(remaining, unit_name="image") if verbose else None
        done = 0
        try:
            with ProcessPoolExecutor(min(workers, len(todo)), mp_context=context) as pool:
                pending = [pool.submit(write_shard, t, progress) for t in todo]
                while not all(p.done() for p in pending) or not progress.empty():
                    try:
                        done += progress.get(timeout=0.2)
                        if bar:
                            bar.update(done)
                    except queue.Empty:
                        pass
                results = [p.result() for p in pending]
        except BrokenProcessPool:
            raise OSError(
                "A worker process died while writing (killed or out of memory). "
                "Finished shards are kept and no partial shard has a final name: "
                "re-run the same command to resume."
            ) from None
        finally:
            manager.shutdown()
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            raise ValueError(
                f"{errors[0]}. Pass --skip-corrupt to skip and count such files "
                f"({len(errors)} shard(s) stopped).")
        for r in results:
            counts[r["shard"]] = r["examples"]
    skipped = [m for r in results for m in r.get("skipped", [])]

    info = read_info(out) or {}
    info.setdefault("splits", {})
    info["splits"][split] = {
        "num_examples": sum(counts.values()), "num_shards": num_shards,
        "shard_examples": {os.path.basename(k): v for k, v in sorted(counts.items())},
    }
    info["class_names"] = class_names
    info["num_classes"] = len(class_names)
    info.setdefault("sources", {})[split] = source
    with tf.io.gfile.GFile(os.path.join(out, schema.INFO_FILE), "w") as f:
        json.dump(info, f, indent=1)
    return {
        "out": out, "split": split, "num_examples": sum(counts.values()),
        "num_shards": num_shards, "shards_written": len(todo),
        "shards_reused": len(reused), "skipped_corrupt": len(skipped),
        "skipped_files": skipped, "class_names": class_names,
    }

