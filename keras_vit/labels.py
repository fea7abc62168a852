"""What a trained classifier knows about its outputs: class names and
whether it outputs logits or probabilities.

>>> keras_vit.labels.set_class_names(model, ["cat", "dog"])  # doctest: +SKIP
>>> keras_vit.labels.class_names(model)  # doctest: +SKIP
['cat', 'dog']
"""


def label_line_problem(name):
    """Why `name` cannot be one line of a label file (one class name per
    line, UTF-8, as `labels.txt` and the export label files), or None when
    it can: "a line break ('\\\\n')" (any character `str.splitlines` breaks
    at), "a control character ('\\\\t')" or "an undecodable byte" (a file
    name that is not UTF-8). Spaces and every printable character are fine.

    >>> label_line_problem("a\\nb")
    "a line break ('\\\\n')"
    >>> label_line_problem("tabby cat") is None
    True
    """
    import unicodedata

    for char in str(name):
        kind = unicodedata.category(char)
        if len(f"a{char}b".splitlines()) > 1:
            return f"a line break ({char!r})"
        if kind == "Cc":
            return f"a control character ({char!r})"
        if kind == "Cs":
            return "an undecodable byte (the name is not UTF-8)"
    return None


def _output_layer(model):
    """The layer producing the model's output, looking inside nested models."""
    import keras

    layer = model
    while isinstance(layer, keras.Model) and layer.layers:
        layer = layer.layers[-1]
    return layer


def head_layer(model):
    """The model's `ClassifierHead`, or None (a head of another kind)."""
    from keras_vit.layers.head import ClassifierHead

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
    not the number of outputs."""
    names = None if names is None else [str(n) for n in names]
    outputs = model.output_shape[-1] if hasattr(model, "output_shape") else None
    if names is not None and outputs is not None and len(names) != outputs:
        raise ValueError(f"{len(names)} class names for a model with {outputs} outputs.")
    head = head_layer(model)
    if head is None:
        return False
    head.class_names = names
    return True
