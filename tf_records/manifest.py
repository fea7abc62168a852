"""The manifest of one split's shards: `<split>.manifest.json` beside
`dataset_info.json`, written by `tf_records build` before its first shard.

It pins what the shards are made of, so that a resumed build never mixes
shards of different runs, and `verify` checks the records against it:

    {"format": 1, "split": "train", "source": "folder:/abs/DIR", "seed": 0,
     "num_shards": 16, "class_names": ["china", ...],
     "files": [["china/0.jpg", 1234, 1700000000000000000], ...],
     "shards": {"train-00000-of-00016": {"examples": 90, "skipped": []}, ...}}

`files`: every source file of the split, sorted, as `[path relative to DIR,
size, mtime_ns]` (size and mtime are null for remote folders such as
`gs://`, where a stat is one request per file). A `tfds:` source has
`"tfds": {"name", "version", "split", "num_examples"}` instead of `files`
(and `seed` null: its order is TFDS's). `shards`: the shards a build
finished, with their record counts and the source files skipped as corrupt
(`[[record name, reason], ...]`, `--skip-corrupt`); updated when a build
ends or fails. (A shard finished by a build killed before it could record
it is kept on resume when it holds the records its plan gives it.)
"""

import json
import os

FORMAT = 1


def manifest_path(out, split):
    return os.path.join(out, f"{split}.manifest.json")


def record_name(path):
    """The `image/filename` of a folder file: `<class folder>/<file>`."""
    parent = os.path.basename(os.path.dirname(path))
    return f"{parent}/{os.path.basename(path)}" if parent else path


def describe(source, split, seed, num_shards, class_names, files=None, tfds=None):
    """The manifest of a build (no `shards` yet). `files`: the source file
    paths of a folder source, under the folder of `source`."""
    manifest = {"format": FORMAT, "split": split, "source": source, "seed": seed,
                "num_shards": num_shards, "class_names": list(class_names)}
    if tfds is not None:
        return dict(manifest, seed=None, tfds=tfds)
    root = source.split(":", 1)[1]
    local = "://" not in root
    rows = []
    for path in sorted(files):
        stat = os.stat(path) if local else None
        rows.append([path[len(root):].lstrip("/"),
                     stat and stat.st_size, stat and stat.st_mtime_ns])
    if local:
        manifest["source"] = f"folder:{os.path.abspath(root)}"
    return dict(manifest, files=rows)


def read(out, split):
    """The manifest of `split` in `out`, or None when there is none."""
    import tensorflow as tf

    path = manifest_path(out, split)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        try:
            return json.load(f)
        except ValueError as error:
            raise ValueError(f"{path} is not valid JSON ({error}); pass --overwrite to "
                             f"rebuild the {split} shards.") from None


def write(out, split, manifest):
    """Writes the manifest atomically (temporary name, then rename)."""
    import tensorflow as tf

    path = manifest_path(out, split)
    tmp = os.path.join(out, f".{split}-manifest.tmp-{os.getpid()}")
    with tf.io.gfile.GFile(tmp, "w") as f:
        json.dump(manifest, f, separators=(",", ":"))
    tf.io.gfile.rename(tmp, path, overwrite=True)


_FLAGS = (("format", "format"), ("source", "--source"), ("seed", "--seed"),
          ("num_shards", "--num-shards"))


def difference(old, new, where):
    """None when the shards of manifest `old` may be resumed by the build of
    manifest `new`; else one sentence saying what differs and what to do.
    `where`: e.g. "the train shards in /data/out"."""
    start_over = "pass --overwrite to start over"
    for key, flag in _FLAGS:
        if old.get(key) != new[key]:
            resume = "" if key == "format" else \
                f"rerun with {flag} {old.get(key)} to resume them, or "
            return (f"{where[0].upper()}{where[1:]} were built with {flag} {old.get(key)}, "
                    f"this run has {flag} {new[key]}; {resume}{start_over}.")
    if old.get("tfds") != new.get("tfds"):
        then, now = ("{name} {version} {split}: {num_examples} examples".format(**facts)
                     for facts in (old["tfds"], new["tfds"]))
        return (f"The TFDS dataset changed since {where} were written ({then} then, {now} "
                f"now); {start_over}.")
    if old.get("class_names") != new["class_names"]:
        return (f"The class folders changed since {where} were written "
                f"({old.get('class_names')} then, {new['class_names']} now); {start_over}.")
    if old.get("files") != new.get("files"):
        before = {row[0]: row[1:] for row in old.get("files") or ()}
        after = {row[0]: row[1:] for row in new.get("files") or ()}
        added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
        modified = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
        example = next(f"{names[0]!r} {what}" for names, what in
                       ((added, "added"), (removed, "removed"), (modified, "modified")) if names)
        return (f"The source folder changed since {where} were written: {_files(added)} "
                f"added, {len(removed)} removed, {len(modified)} modified (e.g. {example}); "
                f"{start_over}.")
    return None


def _files(names):
    return f"{len(names)} file{'' if len(names) == 1 else 's'}"


def expected_names(manifest):
    """The record names (`image/filename`) a folder manifest's shards hold:
    its files less those skipped as corrupt; None for other sources."""
    if manifest.get("files") is None:
        return None
    skipped = {name for shard in manifest.get("shards", {}).values()
               for name, _ in shard.get("skipped", ())}
    names = (record_name(row[0]) for row in manifest["files"])
    return {name for name in names if name not in skipped}
