"""The class names an export carries beside its file: `<stem>.labels.txt`,
one name per line in label order (`keras_vit.labels.write_labels`)."""

import os

from keras_vit import labels as labels_lib
from keras_vit.export._files import remove_stale_temporaries
from keras_vit.labels import class_names


def labels_path(path):
    """`<stem>.labels.txt` beside an export file."""
    return os.path.splitext(str(path))[0] + ".labels.txt"


def labels_beside(names, path):
    """Writes `names` to `labels_path(path)` and returns that path; for a
    model without class names, removes an earlier export's (stale) file
    there and returns None."""
    labels = labels_path(path)
    if names:
        remove_stale_temporaries(labels)  # a killed export's
        return labels_lib.write_labels(names, labels)
    if os.path.exists(labels):
        os.remove(labels)
    return None


def model_class_names(model):
    """The class names stored in `model`'s head, or None."""
    names = class_names(model)
    return list(names) if names else None

