"""`ClassifierHead`: the classification head, a Dense layer that also
carries the class names of the data it was trained on.

The names live in the layer's config, so they travel inside the `.keras`
file (a fresh process that loads the model has them) and into every export.
"""

import keras

from keras_vit._checks import label_line_problem


def _check_names(names, units):
    if names is None:
        return None
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"`class_names` must be a list of strings, got {names!r}.")
    names = list(names)
    for name in names:  # printed one per line, on a terminal too (a `.keras` file's)
        problem = label_line_problem(name)
        if problem:
            raise ValueError(f"Class name {name!r} holds {problem}; a class name is one "
                             "line of printable text.")
    if len(names) != units:
        raise ValueError(f"{len(names)} class names for a head with {units} classes; "
                         "give one name per class, in label order.")
    return names


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassifierHead(keras.layers.Dense):
    """A `Dense` head that knows its class names (`class_names`, in label
    order; None when unknown).

    Example:

    >>> head = ClassifierHead(2, class_names=["cat", "dog"])
    >>> head.class_names
    ['cat', 'dog']
    """

    def __init__(self, units, class_names=None, **kwargs):
        super().__init__(units, **kwargs)
        self._class_names = _check_names(class_names, units)

    @property
    def class_names(self):
        """The class names in label order (a copy), or None when unknown;
        setting them checks them (a TypeError or ValueError naming the
        problem)."""
        return None if self._class_names is None else list(self._class_names)

    @class_names.setter
    def class_names(self, names):
        self._class_names = _check_names(names, self.units)

    def get_config(self):
        config = super().get_config()
        config["class_names"] = self.class_names
        return config
