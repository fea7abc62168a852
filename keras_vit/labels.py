"""What a trained classifier knows about its outputs: class names and
whether it outputs logits or probabilities.

>>> import keras_vit
>>> model = keras_vit.VisionTransformer(
...     patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
...     input_shape=(32, 32, 3), classes=2)
>>> keras_vit.labels.set_class_names(model, ["cat", "dog"])
True
>>> keras_vit.labels.class_names(model)
['cat', 'dog']
"""

import io

import keras

from keras_vit import _atomic, preprocessing
from keras_vit._checks import label_line_problem
from keras_vit.layers.head import ClassifierHead


def _output_layer(model):
    """The layer producing the model's output, looking inside nested models."""
    layer = model
    while isinstance(layer, keras.Model) and layer.layers:
        layer = layer.layers[-1]
    return layer


def head_layer(model):
    """The model's `ClassifierHead`, or None (a head of another kind)."""
    layer = _output_layer(model)
    return layer if isinstance(layer, ClassifierHead) else None


def class_names(model):
    """The class names stored in `model` (list of str), or None."""
    head = head_layer(model)
    return head.class_names if head is not None else None


def set_class_names(model, names):
    """Stores `names` in the model's head, so `model.save` keeps them.

    Returns True when stored; False when the model's last layer is not a
    keras_vit `ClassifierHead` (a head you built yourself): keep the names
    beside the model then. Raises ValueError when the number of names is
    not the number of outputs, or a name is not one line of printable text
    (`label_line_problem`: a line break, a tab, an ANSI escape)."""
    names = None if names is None else [str(n) for n in names]
    for name in names or ():
        _check_name(name, "class_names")
    outputs = model.output_shape[-1] if hasattr(model, "output_shape") else None
    if names is not None and outputs is not None and len(names) != outputs:
        raise ValueError(f"{len(names)} class names for a model with {outputs} outputs.")
    head = head_layer(model)
    if head is None:
        return False
    head.class_names = names
    return True


def class_labels(model, num_classes, labels=None, *, what="labels", label_file=False,
                 unavailable=None):
    """`(names, source)`: the names of the `num_classes` outputs of `model`,
    in label order, and where they come from: `labels` when given
    (`"given"`), else the names stored in the model's head (`"model"`),
    else the ImageNet-1k / ImageNet-21k names of a 1000 / 21843-class head
    (`"ImageNet-1k"`, `"ImageNet-21k"`; downloaded once, see
    `keras_vit.preprocessing.class_names`), else `class_<i>` (`"class_<i>"`).
    What `keras-vit predict` prints and the export label files hold.

    Args:
        labels: a list of str, or None.
        what: how the messages name `labels` (`"metadata labels"`).
        label_file: the names are written one per line (how the message
            says why a name holding a line break or a control character is
            a ValueError; such a name is one whatever `label_file` says:
            names are printed one per line, on a terminal too).
        unavailable: None: an ImageNet label file that cannot be loaded
            (offline, a mirror without it) raises its own error; else
            `(purpose, advice)`: it is the ValueError "The ImageNet-1k label
            file for PURPOSE of this 1000-class head could not be loaded
            (ERROR). ADVICE".

    Raises:
        TypeError: `labels` is not a list of strings.
        ValueError: as many names as classes are not found, or a name does
            not fit on one line (`label_line_problem`).

    >>> class_labels(None, 2, ["cat", "dog"])
    (['cat', 'dog'], 'given')
    >>> class_labels(None, 3)
    (['class_0', 'class_1', 'class_2'], 'class_<i>')
    """
    if labels is not None:
        if isinstance(labels, str) or not all(isinstance(n, str) for n in labels):
            raise TypeError(f"{what} must be a list of strings; got {labels!r:.80}.")
        names, source = list(labels), "given"
    elif class_names(model):
        names, source = list(class_names(model)), "model"
    elif num_classes in preprocessing.LABEL_FILES:
        source = "ImageNet-1k" if num_classes == 1000 else "ImageNet-21k"
        names = _imagenet_names(num_classes, source, unavailable)
    else:
        names, source = [f"class_{i}" for i in range(num_classes)], "class_<i>"
    if len(names) != num_classes:
        raise ValueError(f"{what} has {len(names)} names; the model has {num_classes} "
                         "classes (one name per class, in label order).")
    for name in names:
        if label_file:
            problem = label_line_problem(name)
            if problem:
                raise ValueError(f"Class name {name!r} holds {problem}; the label file "
                                 "has one name per line.")
        _check_name(name, what)
    return names, source


def _check_name(name, what):
    """A ValueError naming `name` and `what` holds it when `name` is not one
    line of printable text (`label_line_problem`)."""
    problem = label_line_problem(name)
    if problem:
        raise ValueError(f"Class name {name!r} in {what} holds {problem}; a class name "
                         "is one line of printable text.")


def _imagenet_names(num_classes, source, unavailable):
    """The ImageNet names of a `num_classes` head (see `class_labels`)."""
    if unavailable is None:
        return list(preprocessing.class_names(num_classes))
    purpose, advice = unavailable
    try:
        return list(preprocessing.class_names(num_classes))
    except Exception as error:  # offline, a mirror without the file: said, not lost
        raise ValueError(
            f"The {source} label file for {purpose} of this {num_classes}-class head "
            f"could not be loaded ({error}). {advice}") from error


def labels_text(names):
    """The text of a label file: `names` one per line, in label order, each
    line ended by a newline (what every label file keras_vit writes holds:
    `labels.txt` of a run, `<stem>.labels.txt` beside an export, the
    SavedModel asset and the file inside a TFLite model)."""
    return "".join(f"{name}\n" for name in names)


def parse_labels(text):
    """The class names of a label file's `text`: its non-blank lines (`\\n`,
    `\\r\\n` or `\\r` ends a line).

    >>> parse_labels("cat\\r\\ndog\\n\\n")
    ['cat', 'dog']
    """
    return [line.rstrip("\n") for line in io.StringIO(text, newline=None) if line.strip()]


def write_labels(names, path):
    """Writes the label file of `names` (`labels_text`) to `path`
    atomically (`keras_vit._atomic`); returns `path`."""
    _atomic.write_text(path, labels_text(names))
    return path


def read_labels(path):
    """The class names in the label file `path` (`parse_labels`;
    `class_labels` checks their count against the model's classes).

    Raises:
        ValueError: no file at `path` ("Labels file not found: 'PATH'.").
    """
    try:
        with open(path, encoding="utf-8") as f:
            return parse_labels(f.read())
    except FileNotFoundError:
        raise ValueError(f"Labels file not found: {path!r}.") from None
