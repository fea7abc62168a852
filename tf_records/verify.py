"""`python -m tf_records verify DIR`: decode every record, report counts per
split and every corrupt record by file and index."""

import collections
import os


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
    if not shards:
        report["problems"].append("no shards named <split>-NNNNN-of-NNNNN")
    num_classes = info.get("num_classes")
    for split, files in sorted(shards.items()):
        counts = {}
        expected_shards = {count for _, _, count in files}
        if len(expected_shards) != 1:
            report["problems"].append(
                f"{split}: shards of different totals {sorted(expected_shards)}")
        total = max(expected_shards)
        missing = sorted(set(range(total)) - {i for _, i, _ in files})
        if missing:
            report["problems"].append(
                f"{split}: missing shards {[schema.shard_name(split, i, total) for i in missing]}")
        for name, _, _ in files:
            path = os.path.join(directory, name)
            n = 0
            try:
                for index, serialized in enumerate(tf.data.TFRecordDataset(path)):
                    n = index + 1
                    problem = _check_record(tf, schema, serialized, num_classes)
                    if problem:
                        report["corrupt"].append({"file": name, "index": index, "error": problem})
            except tf.errors.DataLossError as error:
                report["corrupt"].append({"file": name, "index": n,
                                          "error": f"unreadable from here on: {error.message.splitlines()[0]}"})
            counts[name] = n
        expected = info.get("splits", {}).get(split, {}).get("num_examples")
        found = sum(counts.values())
        if expected is not None and expected != found:
            report["problems"].append(
                f"{split}: {found} records, dataset_info.json says {expected}")
        report["splits"][split] = {"num_examples": found, "num_shards": len(files),
                                   "expected_examples": expected}
    if leftovers:
        report["problems"].append(
            f"temporary files of an interrupted build: {leftovers} (re-run build to resume)")
    report["ok"] = not report["corrupt"] and not report["problems"]
    return report


def _check_record(tf, schema, serialized, num_classes):
    try:
        example = schema.parse_example(serialized)
        image = tf.io.decode_image(example["image/encoded"], channels=3,
                                   expand_animations=False)
    except (tf.errors.InvalidArgumentError, ValueError) as error:
        return str(getattr(error, "message", error)).splitlines()[0]
    label = int(example["image/class/label"])
    if num_classes is not None and not 0 <= label < num_classes:
        return f"label {label} outside [0, {num_classes})"
    h, w = int(example["image/height"]), int(example["image/width"])
    if (h, w) != (0, 0) and (h, w) != tuple(image.shape[:2]):
        return f"image/height,width say {h}x{w}, the image is {image.shape[0]}x{image.shape[1]}"
    return None
