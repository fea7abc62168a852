"""Data sources: `tfds:NAME[:VERSION]`, `tfrecord:GLOB_OR_DIR`, `folder:DIR`.

Each opens as a `Source`: a `tf.data.Dataset` of `(encoded_bytes, label,
name)` records (undecoded, so caching and shuffling stay cheap), the number
of examples when known, and the class names. `gs://` and other
`tf.io.gfile` paths work wherever a path is taken.

`folder:DIR` comes in two layouts: `DIR/<split>/<class>/<images>` (split
subfolders named in `SPLIT_FOLDER_NAMES`; a missing split is an error
naming those there are) or `DIR/<class>/<images>` (split by a
deterministic, stratified `holdout`: `"train"` and the held-out
`"validation"`).

>>> src = open_source("folder:/data/flowers", "validation")  # reads /data/flowers  # doctest: +SKIP
>>> src.description  # doctest: +SKIP
'folder:/data/flowers (validation: 10% holdout)'
"""

import dataclasses
import hashlib
import json
import logging
import os

import tensorflow as tf

from keras_vit import _checks
from keras_vit._image_files import (
    IMAGE_EXTENSIONS, is_image_name, left_out_sentence, other_image_type, unreadable_reason,
)
from keras_vit.data import schema
from keras_vit.data.graph import as_written
from keras_vit.labels import label_line_problem

SCHEMES = ("tfds", "tfrecord", "folder")
logger = logging.getLogger("keras_vit")


@dataclasses.dataclass
class Source:
    """One split of a data source.

    `records`: the cheap, undecoded elements (file names, serialized
    examples); `read` maps one to `(encoded, label, name)`. Shard `records`
    before `read` so that a worker reads only its own files.

    `class_names`: ALL the classes of the dataset (not only those present
    in this split), so label indices agree between splits. `labels`: the
    int label of each record, in record order, where it is known without
    reading the data (folders); None otherwise. `split_kind`: where the
    split comes from: `"folder"` (a `DIR/<split>/` subfolder), `"holdout"`
    (a folder of class subfolders, split by `holdout`), `"tfrecord"` or
    `"tfds"`. `description`: for people, e.g.
    `"folder:/data/x (validation: 10% holdout)"`. `skipped`: the paths of
    image files left out at listing because they cannot be read (a
    dangling symbolic link, a directory named like an image...; only with
    `skip_corrupt=True`, else listing stops naming the first).
    """

    records: tf.data.Dataset
    read: object
    num_examples: int            # None when unknown
    class_names: list
    description: str
    labels: list = None          # int per record, when known cheaply (folders)
    split_kind: str = None       # "folder" | "holdout" | "tfrecord" | "tfds"
    skipped: list = dataclasses.field(default_factory=list)  # unreadable, left out

    @property
    def num_classes(self):
        """The number of classes (of `class_names`)."""
        return len(self.class_names)

    @property
    def classes_present(self):
        """Distinct labels among this split's records; None when unknown."""
        return None if self.labels is None else len(set(self.labels))

    @property
    def dataset(self):
        """`(encoded, label, name)` records."""
        return self.records.map(as_written(self.read), num_parallel_calls=tf.data.AUTOTUNE)


def parse_source(source):
    """`"folder:/data/x"` -> `("folder", "/data/x")`; raises on unknown schemes."""
    if not isinstance(source, str) or ":" not in source:
        raise ValueError(
            f"Data source {source!r} has no scheme; use one of "
            f"{', '.join(s + ':...' for s in SCHEMES)} (e.g. 'tfds:cifar10', "
            "'tfrecord:gs://bucket/train-*', 'folder:/data/images')."
        )
    scheme, rest = source.split(":", 1)
    if scheme not in SCHEMES:
        raise ValueError(
            f"Unknown data source scheme {scheme!r} in {source!r}; valid: "
            f"{', '.join(repr(s) for s in SCHEMES)}."
        )
    if not rest:
        raise ValueError(f"Data source {source!r} names nothing after '{scheme}:'.")
    return scheme, rest


def open_source(source, split="train", data_dir=None, label_offset=0, holdout=0.1,
                skip_corrupt=False):
    """Opens a source string for one split; returns a `Source`.

    Args:
        source: `"folder:DIR"`, `"tfrecord:GLOB_OR_DIR"` or
            `"tfds:NAME[:VERSION]"`.
        split: the split. For a folder: with split subfolders
            (`DIR/train/`, `DIR/test/`, ...) the subfolder of that name
            (`"validation"`, `"val"` and `"valid"` stand for each other when
            only one of them exists); without them (class subfolders
            directly under DIR) `"train"` or one of `"validation"`, `"val"`,
            `"valid"`, `"test"`, `"holdout"` (all the held-out files).
        data_dir: TFDS data directory.
        label_offset: added to TFRecord labels (-1 for the 1-based TPU
            ImageNet shards).
        holdout: a folder of class subfolders only: the fraction of each
            class held out (a float in [0, 1)); ignored by other sources.
        skip_corrupt: a folder only: an image file that cannot be read (a
            dangling symbolic link or a loop, a directory named like an
            image, no read permission) is left out and named in
            `Source.skipped`; False (default): a ValueError naming it.

    Example (a folder of two classes of five 8x8 PNGs):

    >>> import shutil, tempfile, numpy as np
    >>> folder, png = tempfile.mkdtemp(), tf.io.encode_png(np.zeros((8, 8, 3), "uint8"))
    >>> for i in range(10):
    ...     tf.io.write_file(os.path.join(folder, ("cat", "dog")[i % 2], f"{i}.png"), png)
    >>> src = open_source(f"folder:{folder}", "validation", holdout=0.2)
    >>> src.description, src.num_examples, src.classes_present
    ('folder:... (validation: 20% holdout)', 2, 2)
    >>> shutil.rmtree(folder)
    """
    scheme, rest = parse_source(source)
    if scheme == "folder":
        return folder_source(rest, split, holdout, skip_corrupt)
    if scheme == "tfrecord":
        return tfrecord_source(rest, split, label_offset)
    return tfds_source(rest, split, data_dir)


# --- folders --------------------------------------------------------------

# Subfolder names that make `folder:DIR` a split layout (DIR/<split>/<class>/).
SPLIT_FOLDER_NAMES = ("train", "validation", "val", "valid", "test")
# Split names of the held-out files of a class layout (DIR/<class>/).
HOLDOUT_SPLITS = ("validation", "val", "valid", "test", "holdout")
_VALIDATION_ALIASES = ("validation", "val", "valid")
_IGNORED_FILES = ("thumbs.db", "desktop.ini")
_logged_holdouts = set()   # (DIR, holdout): the holdout line is logged once per process


def _subfolders(path):
    return sorted(name.rstrip("/") for name in tf.io.gfile.listdir(path)
                  if tf.io.gfile.isdir(os.path.join(path, name)))


def _split_folders(directory, subfolders):
    """The split subfolders of DIR: named like a split, holding subfolders."""
    return [name for name in subfolders if name in SPLIT_FOLDER_NAMES
            and _subfolders(os.path.join(directory, name))]


def _image_files(folder):
    """Sorted image file names in `folder`, the names of its other files, and
    `{name: why}` of the image names that cannot be read."""
    images, others = [], []
    for filename in sorted(tf.io.gfile.listdir(folder)):
        if filename.endswith("/"):
            continue
        if is_image_name(filename):
            images.append(filename)
        elif not filename.startswith(".") and filename.lower() not in _IGNORED_FILES:
            others.append(filename)
    if "://" in folder:  # object stores: no links, directories end in "/"
        return images, others, {}
    why = ((f, _unreadable(os.path.join(folder, f))) for f in images)
    return images, others, {f: reason for f, reason in why if reason}


def _unreadable(path):
    """Why the local `path` cannot be read as a file (one stat and one
    access check, no read), or None: the rule `keras-vit predict` applies
    too (`_image_files.unreadable_reason`)."""
    return unreadable_reason(path)


def _unreadable_error(unreadable, source, hint=True):
    """The ValueError naming the first of `unreadable` (`{path: why}`)."""
    path, reason = next(iter(unreadable.items()))
    more = len(unreadable) - 1
    return ValueError(
        f"Cannot read image file {path!r} ({reason})"
        + (f"; {more} more in {source} cannot be read either" if more else "")
        + ("; pass skip_corrupt=True (keras-vit: --skip-corrupt) to skip and count such "
           "files." if hint else "; remove or repair it."))


def _check_class_names(paths):
    """A ValueError for the first class folder (of `paths`) whose name cannot
    be a line of labels.txt."""
    for path in paths:
        problem = label_line_problem(os.path.basename(path))
        if problem:
            raise ValueError(
                f"Class folder {path!r} has a name holding {problem}; class names are "
                "written one per line (labels.txt, the export label files), so rename "
                "it: a class name may hold any printable characters and spaces, but no "
                "line breaks, tabs or other control characters.")


def check_holdout(holdout):
    """`holdout` (a fraction of each class, in [0, 1)) as a float."""
    return _checks.fraction(holdout, "holdout", "the fraction of each class held out for "
                            "validation, e.g. 0.1")


def _percent(holdout, digits=4):
    return f"{holdout * 100:.{digits}g}%"


def _real_share(holdout, held, total):
    """`": 3 of 9 images, 33%"` when holding out `holdout` of each class
    (rounded per class, `holdout_count`) holds out another share of the
    `total` images than `holdout` (to 2 significant digits); else ""."""
    if not total or _percent(held / total, 2) == _percent(holdout, 2):
        return ""
    return f": {held:,} of {total:,} images, {_percent(held / total, 2)}"


def stable_order(relative_paths):
    """`relative_paths` ordered by the sha1 of each (a stable, seedless
    shuffle: the same on every machine, and a file keeps its place when
    other files come or go)."""
    return sorted(relative_paths,
                  key=lambda p: (hashlib.sha1(p.encode("utf-8")).hexdigest(), p))


def holdout_count(n, holdout):
    """Files held out of a class of `n`: `max(1, round(holdout * n))` when
    `n >= 2` and `holdout > 0`, at most `n - 1`; none of a class of one."""
    if n < 2 or holdout <= 0:
        return 0
    return min(n - 1, max(1, round(holdout * n)))


def list_folder(directory, split="train", holdout=0.0):
    """`(files, labels, class_names)` of one split of an image folder.

    Two layouts:

    - split layout: DIR has split subfolders (`train`, `validation`, `val`,
      `valid`, `test`; `SPLIT_FOLDER_NAMES`) holding class subfolders. The
      split is `DIR/<split>/`; a missing split is a ValueError naming the
      split subfolders there are. Classes are the union of the class
      subfolders of all the splits, so labels agree between splits.
    - class layout: class subfolders directly under DIR. `"train"` is every
      class minus its held-out files; `"validation"` / `"val"` / `"valid"` /
      `"test"` / `"holdout"` the held-out files: per class, the files
      ordered by the sha1 of their path relative to DIR, the first
      `max(1, round(holdout * n))` of a class of `n >= 2` files.

    Classes are the sorted subfolder names; files the sorted image files in
    each (hidden and non-image files are left out; their count is logged).
    A class folder whose name holds a line break or another control
    character (it could not be one line of labels.txt), and an image file
    that cannot be read (a dangling symbolic link or a loop, a directory
    named like an image, no read permission), are a ValueError naming it.

    Unlike `open_source` and `make_dataset` (0.1), `holdout` defaults to 0
    here: `"train"` of a class layout is then every file (what
    `tf_records build` converts), and a held-out split a ValueError.
    """
    files, labels, classes, _, _, unreadable = _list_folder(directory, split, holdout)
    if unreadable:
        raise _unreadable_error(unreadable, f"folder:{directory}", hint=False)
    return files, labels, classes


def _list_folder(directory, split, holdout):
    """`(files, labels, classes, kind, description, unreadable)`: `files`
    leaves out the split's image files that cannot be read, `unreadable`
    (`{path: why}`) holds them."""
    holdout = check_holdout(holdout)
    if not isinstance(split, str) or not split:
        raise ValueError(f"split={split!r}; give a split name such as 'train'.")
    if not tf.io.gfile.isdir(directory):
        raise ValueError(f"Image folder not found: {directory!r}.")
    source = f"folder:{directory}"
    subfolders = _subfolders(directory)
    splits = _split_folders(directory, subfolders)
    if splits:
        return _list_split_layout(directory, source, subfolders, splits, split)
    return _list_class_layout(directory, source, subfolders, split, holdout)


def _list_split_layout(directory, source, subfolders, splits, split):
    """`_list_folder` for DIR/<split>/<class>/<images>."""
    chosen = split if split in splits else None
    if chosen is None and split in _VALIDATION_ALIASES:
        aliases = [name for name in splits if name in _VALIDATION_ALIASES]
        chosen = aliases[0] if len(aliases) == 1 else None
    if chosen is None:
        others = [name for name in subfolders if name not in splits]
        raise ValueError(
            f"{source} has no split {split!r}: its split subfolders are "
            f"{', '.join(repr(s) for s in splits)}."
            + (f" (Its other subfolders, {', '.join(repr(s) for s in others[:5])}"
               f"{', ...' if len(others) > 5 else ''}, are not splits.)"
               if others else ""))
    class_folders = {}  # class name -> its first folder, for the name check
    for s in splits:
        for c in _subfolders(os.path.join(directory, s)):
            class_folders.setdefault(c, os.path.join(directory, s, c))
    classes = sorted(class_folders)
    _check_class_names(class_folders[c] for c in classes)
    root = os.path.join(directory, chosen)
    files, labels, others, unreadable = [], [], [], {}
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        if not tf.io.gfile.isdir(folder):
            continue
        images, skipped, bad = _image_files(folder)
        others += skipped
        unreadable.update({os.path.join(folder, f): bad[f] for f in images if f in bad})
        files += [os.path.join(folder, f) for f in images if f not in bad]
        labels += [label] * (len(images) - len(bad))
    _log_others(root, others)
    if not files and not unreadable:
        raise ValueError(
            f"No image files ({', '.join(IMAGE_EXTENSIONS)}) under {root!r}; expected "
            f"{root}/<class_name>/<image files>.")
    name = split if chosen == split else f"{split}: subfolder {chosen!r}"
    return files, labels, classes, "folder", f"{source} ({name})", unreadable


def _list_class_layout(directory, source, subfolders, split, holdout):
    """`_list_folder` for DIR/<class>/<images>: the held-out split is chosen
    by a stable hash of each file's path."""
    if split != "train" and split not in HOLDOUT_SPLITS:
        raise ValueError(
            f"{source} has no split subfolders ({', '.join(SPLIT_FOLDER_NAMES)}), so its "
            f"splits are 'train' and the held-out {', '.join(repr(s) for s in HOLDOUT_SPLITS)}; "
            f"got split={split!r}.")
    classes = subfolders
    if not classes:
        raise ValueError(
            f"Image folder {directory!r} has no class subfolders; expected "
            f"{directory}/<class_name>/<image files> (or "
            f"{directory}/train/<class_name>/<image files> and a test/ or validation/ "
            "beside it).")
    _check_class_names(os.path.join(directory, c) for c in classes)
    per_class, others, bad_files = [], [], {}
    for name in classes:
        images, skipped, bad = _image_files(os.path.join(directory, name))
        others += skipped
        per_class.append(images)  # the unreadable too: they keep the holdout stable
        bad_files.update({os.path.join(directory, name, f): why for f, why in bad.items()})
    _log_others(directory, others)
    total = sum(len(images) for images in per_class)
    if not total:
        raise ValueError(f"No image files ({', '.join(IMAGE_EXTENSIONS)}) under "
                         f"{directory!r}.")
    held = 0
    files, labels, unreadable = [], [], {}
    for label, (name, images) in enumerate(zip(classes, per_class, strict=True)):
        k = holdout_count(len(images), holdout)
        held += k
        held_out = set(stable_order([f"{name}/{f}" for f in images])[:k])
        want_held = split != "train"
        for f in images:  # sorted order within a class, as in the split layout
            path = os.path.join(directory, name, f)
            if (f"{name}/{f}" in held_out) != want_held:
                continue
            if path in bad_files:
                unreadable[path] = bad_files[path]
            else:
                files.append(path)
                labels.append(label)
    real = _real_share(holdout, held, total)  # "" when rounding kept the fraction
    if split == "train":
        description = (f"{source} (train: {_percent(holdout)} of each class held out{real})"
                       if held else f"{source} (train: all images, no holdout)")
    else:
        description = f"{source} ({split}: {_percent(holdout)} holdout{real})"
        if holdout == 0:
            raise ValueError(
                f"{source} has no split subfolders and holdout=0, so there is no held-out "
                f"set for split {split!r}. Pass holdout > 0 (e.g. 0.1; keras-vit: "
                f"--holdout 0.1) or give the folder {directory}/train/ and "
                f"{directory}/validation/ (or test/) subfolders.")
        if not held:
            raise ValueError(
                f"{source} has no image to hold out for split {split!r}: every class has "
                "fewer than 2 images.")
    if held and (directory, holdout) not in _logged_holdouts and real:
        _logged_holdouts.add((directory, holdout))
        logger.info(
            "%s has no train/validation/test subfolders: holding out %s of the images, "
            "not %s (%s of %s: %s of each class rounded to whole images, at least one of "
            "each class of 2 or more), chosen by a stable hash of each file's path, as the "
            "validation split.", source, _percent(held / total, 2), _percent(holdout),
            f"{held:,}", f"{total:,}", _percent(holdout))
    elif held and (directory, holdout) not in _logged_holdouts:
        _logged_holdouts.add((directory, holdout))
        logger.info(
            "%s has no train/validation/test subfolders: holding out %s of each class "
            "(%s of %s images, chosen by a stable hash of each file's path) as the "
            "validation split.", source, _percent(holdout), f"{held:,}", f"{total:,}")
    return files, labels, classes, "holdout", description, unreadable


def _log_others(root, others):
    """Logs the files of `others` (names) left out of `root`: image files of
    a type keras_vit does not read as a warning (`left_out_sentence`, the
    wording of `keras-vit predict`), the other files counted."""
    if others and root not in _logged_others:
        _logged_others.add(root)
        left_out = left_out_sentence(root, others)
        if left_out:
            logger.warning("%s", left_out)
        count = sum(other_image_type(name) is None for name in others)
        if count:
            logger.info("%s: left out %d file%s without an image extension (%s).", root,
                        count, "" if count == 1 else "s", ", ".join(IMAGE_EXTENSIONS))


_logged_others = set()


def folder_source(directory, split="train", holdout=0.1, skip_corrupt=False):
    """The `Source` of one split of `folder:DIR` (see `list_folder`); with
    `skip_corrupt`, the image files that cannot be read are left out and
    named in `Source.skipped`, else the first is a ValueError."""
    files, labels, classes, kind, description, unreadable = _list_folder(
        directory, split, holdout)
    if unreadable and not skip_corrupt:
        raise _unreadable_error(unreadable, f"folder:{directory}")
    if unreadable:
        if not files:
            path, reason = next(iter(unreadable.items()))
            raise ValueError(f"None of the {len(unreadable)} image files of {description} "
                             f"can be read (the first: {path!r}, {reason}).")
        logger.warning("%s: skipping %d image file%s that cannot be read (%r: %s%s).",
                       description, len(unreadable), "" if len(unreadable) == 1 else "s",
                       *next(iter(unreadable.items())),
                       ", ..." if len(unreadable) > 1 else "")
    paths = tf.data.Dataset.from_tensor_slices((files, labels))

    def read(path, label):
        return tf.io.read_file(path), tf.cast(label, tf.int64), path

    return Source(paths, read, len(files), classes, description, labels=list(labels),
                  split_kind=kind, skipped=list(unreadable))


# --- TFRecords ------------------------------------------------------------

def read_info(directory):
    """`dataset_info.json` of a `tf_records build` output, or None."""
    path = os.path.join(directory, schema.INFO_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def tfrecord_files(spec, split):
    """Shard files of `split` in a directory, or the files of a glob."""
    if tf.io.gfile.isdir(spec):
        pattern = os.path.join(spec, f"{split}-*-of-*")
        directory = spec
    else:
        pattern, directory = spec, os.path.dirname(spec)
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise ValueError(f"No TFRecord files match {pattern!r}.")
    return files, directory


def tfrecord_source(spec, split, label_offset=0):
    files, directory = tfrecord_files(spec, split)
    info = read_info(directory) if directory else None
    class_names = (info or {}).get("class_names")
    num_examples = None
    if info and tf.io.gfile.isdir(spec):
        num_examples = info.get("splits", {}).get(split, {}).get("num_examples")
    dataset = tf.data.Dataset.from_tensor_slices(files)
    dataset = dataset.interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(files), 16),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True,
    )

    def parse(serialized):
        example = schema.parse_example(serialized)
        return (example["image/encoded"],
                example["image/class/label"] + label_offset,
                example["image/filename"])

    return Source(dataset, parse, num_examples, class_names or [],
                  f"tfrecord:{spec} ({split})", split_kind="tfrecord")


# --- TFDS -----------------------------------------------------------------

def tfds_source(spec, split, data_dir=None):
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ValueError(
            "The 'tfds:' source needs tensorflow-datasets: pip install "
            "tensorflow-datasets (or 'keras-vision-transformer[tfds]')."
        ) from None
    name, _, version = spec.partition(":")
    full_name = f"{name}:{version}" if version else name
    try:
        builder = tfds.builder(full_name, data_dir=data_dir)
    except Exception as error:  # noqa: BLE001  DatasetNotFoundError and friends
        raise ValueError(f"Unknown TFDS dataset {full_name!r}: {error}") from None
    features = builder.info.features
    image_key = next((k for k in ("image",) if k in features), None)
    label_key = next((k for k in ("label",) if k in features), None)
    if image_key is None or label_key is None:
        raise ValueError(
            f"TFDS dataset {full_name!r} has no 'image' and 'label' features "
            f"(it has {sorted(features.keys())})."
        )
    try:
        dataset = builder.as_dataset(
            split=split, shuffle_files=False,
            decoders={image_key: tfds.decode.SkipDecoding()},
        )
    except Exception as error:
        if builder.is_prepared():
            raise
        raise ValueError(
            f"TFDS dataset {full_name!r} is not prepared in "
            f"{builder.data_dir!r} and cannot be downloaded here. Prepare it "
            f"where the data is reachable (`tfds build {name}` or "
            f"`tfds.builder('{full_name}').download_and_prepare()`), then pass "
            "`data_dir=` pointing at that TFDS data directory."
        ) from error
    def read(i, ex):
        name = ex["file_name"] if "file_name" in ex else \
            tf.strings.format("tfds:{}[{}] #{}", (full_name, split, i))
        return ex[image_key], tf.cast(ex[label_key], tf.int64), name

    records = dataset.enumerate()
    try:
        num_examples = builder.info.splits[split].num_examples
    except (KeyError, ValueError):
        num_examples = None
    class_names = list(features[label_key].names)
    return Source(records, read, num_examples, class_names, f"tfds:{full_name} ({split})",
                  split_kind="tfds")
