"""The class names an export carries beside its file: `<stem>.labels.txt`,
one name per line in label order, written atomically."""

import os

from keras_vit.export._files import temporary_path
from keras_vit.labels import class_names


def write_labels(names, path):
    """Writes `names` one per line to `path` atomically; returns `path`."""
    temporary = temporary_path(path)
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            f.write("".join(f"{name}\n" for name in names))
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.remove(temporary)
    return path


def labels_path(path):
    """`<stem>.labels.txt` beside an export file."""
    return os.path.splitext(str(path))[0] + ".labels.txt"


def labels_beside(names, path):
    """Writes `names` to `labels_path(path)` and returns that path; for a
    model without class names, removes an earlier export's (stale) file
    there and returns None."""
    labels = labels_path(path)
    if names:
        return write_labels(names, labels)
    if os.path.exists(labels):
        os.remove(labels)
    return None


def model_class_names(model):
    """The class names stored in `model`'s head, or None."""
    names = class_names(model)
    return list(names) if names else None

