"""`python -m tf_records verify DIR`: decode every record, report counts per
split and every corrupt record by file and index.

It fails on an empty shard, a record count other than `dataset_info.json`
says, a duplicated `image/filename` and, where the split has a
`<split>.manifest.json` (`tf_records build` writes one), a shard count
other than the manifest records, and source files with no record or
records of no source file."""

import collections
import os

from tf_records import manifest
from tf_records.build import tf_error_text


def verify(directory):
    """Returns a report dict; `report["ok"]` is False on any problem."""
    import tensorflow as tf

    from keras_vit.data import schema
    from keras_vit.data.sources import read_info

    if not tf.io.gfile.isdir(directory):
        raise ValueError(f"Not a directory: {directory!r}.")
    info = read_info(directory) or {}
    shards = collections.defaultdict(list)
    for name in sorted(tf.io.gfile.listdir(directory)):
        match = schema.SHARD_RE.match(name)
        if match:
            shards[match["split"]].append((name, int(match["index"]), int(match["count"])))
    leftovers = [n for n in tf.io.gfile.listdir(directory) if ".tmp-" in n]
    report = {"directory": directory, "splits": {}, "corrupt": [],
              "problems": [], "temporary_files": leftovers}
    problems = report["problems"]
    if not shards:
        problems.append("no shards named <split>-NNNNN-of-NNNNN")
    num_classes = info.get("num_classes")
    for split, files in sorted(shards.items()):
        try:
            plan = manifest.read(directory, split)
        except ValueError as error:
            plan = None
            problems.append(str(error))
        recorded = (plan or {}).get("shards", {})
        counts, names = {}, collections.Counter()
        expected_shards = {count for _, _, count in files}
        if len(expected_shards) != 1:
            problems.append(f"{split}: shards of different totals {sorted(expected_shards)}")
        total = max(expected_shards)
        missing = sorted(set(range(total)) - {i for _, i, _ in files})
        if missing:
            problems.append(
                f"{split}: missing shards {[schema.shard_name(split, i, total) for i in missing]}")
        if plan and plan.get("num_shards") != total:
            problems.append(f"{split}: {total} shards, its manifest says {plan.get('num_shards')}")
        for name, _, _ in files:
            path = os.path.join(directory, name)
            n = 0
            try:
                for index, serialized in enumerate(tf.data.TFRecordDataset(path)):
                    n = index + 1
                    problem, filename = _check_record(tf, schema, serialized, num_classes)
                    if problem:
                        report["corrupt"].append({"file": name, "index": index, "error": problem})
                    if filename:
                        names[filename] += 1
            except tf.errors.DataLossError as error:
                report["corrupt"].append({
                    "file": name, "index": n,
                    "error": f"unreadable from here on: {tf_error_text(error)}"})
            counts[name] = n
            want = recorded.get(name, {}).get("examples")
            if plan and want is None:
                problems.append(f"{name}: not recorded as finished in {split}.manifest.json "
                                "(an interrupted build: re-run it to resume)")
            elif want is not None and n != want:
                problems.append(f"{name}: {n} records, its manifest says {want}")
            elif n == 0 and want is None:
                problems.append(f"{name}: empty shard (no records)")
        problems.extend(_name_problems(split, names, plan))
        expected = info.get("splits", {}).get(split, {}).get("num_examples")
        found = sum(counts.values())
        if expected is not None and expected != found:
            problems.append(f"{split}: {found} records, dataset_info.json says {expected}")
        report["splits"][split] = {"num_examples": found, "num_shards": len(files),
                                   "expected_examples": expected, "manifest": plan is not None}
    if leftovers:
        problems.append(
            f"temporary files of an interrupted build: {leftovers} (re-run build to resume)")
    report["ok"] = not report["corrupt"] and not problems
    return report


def _name_problems(split, names, plan):
    """Duplicated record names, and (folder manifests) source files without
    a record and records of no source file."""
    def some(items):
        items = sorted(items)
        return f"{len(items)} ({', '.join(items[:3])}{', ...' if len(items) > 3 else ''})"

    problems = []
    duplicates = [name for name, count in names.items() if count > 1]
    if duplicates:
        problems.append(f"{split}: source files in more than one record: {some(duplicates)}")
    expected = manifest.expected_names(plan) if plan else None
    if expected is not None:
        if expected - names.keys():
            problems.append(f"{split}: source files of the manifest with no record: "
                            f"{some(expected - names.keys())}")
        if names.keys() - expected:
            problems.append(f"{split}: records of no source file of the manifest: "
                            f"{some(names.keys() - expected)}")
    return problems


def _check_record(tf, schema, serialized, num_classes):
    """`(problem or None, image/filename)` of one serialized record."""
    filename = None
    try:
        example = schema.parse_example(serialized)
        filename = example["image/filename"].numpy().decode("utf-8", "replace")
        image = tf.io.decode_image(example["image/encoded"], channels=3,
                                   expand_animations=False)
    except (tf.errors.InvalidArgumentError, ValueError) as error:
        return str(getattr(error, "message", error)).splitlines()[0], filename
    label = int(example["image/class/label"])
    if num_classes is not None and not 0 <= label < num_classes:
        return f"label {label} outside [0, {num_classes})", filename
    h, w = int(example["image/height"]), int(example["image/width"])
    if (h, w) != (0, 0) and (h, w) != tuple(image.shape[:2]):
        return (f"image/height,width say {h}x{w}, the image is "
                f"{image.shape[0]}x{image.shape[1]}"), filename
    return None, filename
