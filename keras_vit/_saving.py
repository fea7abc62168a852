"""Loading `.keras` files with one clear sentence for each way it can fail
(what the CLI, `train` and `evaluate` use): not a `.keras` name, missing,
a directory, present but unreadable (not a zip archive: truncated, or
another file renamed), a class that is not registered (keras_vit's, or
the user's own), or code the file asks to run (a Lambda layer, a function
outside Keras), which safe_mode refuses; and writing them so that a kill
never leaves a partial file, from every process of a multi-process JAX
job."""

import contextlib
import json
import os
import re
import zipfile

import keras_vit
from keras_vit import _compat

_UNREGISTERED = re.compile(r"Could not locate (?:class|function) '([^']+)'")
_REGISTERED_AS = re.compile(r"'registered_name': '([^']+)'")


def check_keras_path(path, what="MODEL"):
    """`path` as a string if it names an existing, readable `.keras` file;
    else a ValueError saying which of those it is not."""
    path = str(path)
    if path.endswith(".npz"):
        raise ValueError(
            f"{what} must be a .keras file written by keras-vit train or model.save; got "
            f"{path!r} (an official checkpoint: use keras-vit predict --model auto "
            f"--weights {path}).")
    if not path.endswith(".keras"):
        raise ValueError(f"{what} must be a .keras file written by keras-vit train or "
                         f"model.save; got {path!r}.")
    if os.path.isdir(path):
        raise ValueError(f"{what} {path!r} is a directory, not a .keras file.")
    if not os.path.exists(path):
        raise ValueError(f"Model not found: {path!r}.")
    try:
        readable = zipfile.is_zipfile(path)
    except OSError as error:
        raise ValueError(f"{what} {path!r} exists but cannot be read: "
                         f"{error.strerror or error}.") from None
    if not readable:
        raise ValueError(
            f"{what} {path!r} exists but is not a readable .keras file (a .keras file is "
            f"a zip archive; this one, {os.path.getsize(path):,} bytes, is not: truncated "
            "by an interrupted copy or download, or another kind of file renamed).")
    return path


def keras_input_shape(path):
    """The input shape `(None, H, W, C)` a `.keras` file's model declares
    (read from the archive's `config.json`, nothing loaded or built); None
    when it cannot tell (several inputs, a subclassed model)."""
    path = check_keras_path(path, "MODEL")
    try:
        with zipfile.ZipFile(path) as archive:
            if archive.getinfo("config.json").file_size > 64 << 20:
                return None  # no model's config is that large: let load_model judge
            config = json.loads(archive.read("config.json"))
        inputs = [layer["config"] for layer in config["config"]["layers"]
                  if layer.get("class_name") == "InputLayer"]
        if len(inputs) == 1:
            shape = inputs[0].get("batch_shape") or inputs[0].get("batch_input_shape")
            return tuple(shape) if shape else None
        shape = (config.get("build_config") or {}).get("input_shape")
        return tuple(shape) if shape and not inputs else None
    except (KeyError, TypeError, AttributeError, ValueError, zipfile.BadZipFile):
        return None


def load_keras_model(path, what="MODEL"):
    """`keras.saving.load_model(path)` after `check_keras_path`; a failure
    is one ValueError naming the file (and, for a class Keras cannot find,
    what to import)."""
    import keras  # Keras (TensorFlow): `keras-vit --help` imports this module

    path = check_keras_path(path, what)
    keras_vit._load_all()  # registers every keras_vit class
    try:
        return keras.saving.load_model(path)
    except (ValueError, TypeError, OSError, KeyError, zipfile.BadZipFile) as error:
        text = str(error).strip()
        missing = _UNREGISTERED.search(text)
        code = _code_asked_for(path, text, missing)
        if code:
            raise ValueError(
                f"Cannot load {path!r}: the file asks to run code that is not part of "
                f"Keras or keras_vit ({code}), and loading in safe_mode refuses it. A "
                "model keras_vit writes never holds code; load .keras files only from a "
                "source you trust.") from None
        if missing:
            registered = _REGISTERED_AS.search(text, missing.end())  # its own config
            name = registered.group(1) if registered else missing.group(1)
            if name.startswith("keras_vit>"):
                raise ValueError(
                    f"Cannot load {path!r}: it needs keras_vit's {name.split('>')[1]!r}, "
                    f"which this keras_vit ({keras_vit.__version__}) does not have (written "
                    "by another version?). Load it with the keras_vit version that wrote "
                    "it.") from None
            raise ValueError(
                f"Cannot load {path!r}: it needs the custom class {name!r}, which is not "
                "registered in this process; import the module that defines it (with "
                "@keras.saving.register_keras_serializable) before loading, e.g. in "
                "Python: import mymodule, then keras.saving.load_model(path).") from None
        first = text.splitlines()[0] if text else type(error).__name__
        raise ValueError(f"Cannot load {path!r} as a Keras model: {first}") from error


def _code_asked_for(path, text, missing):
    """What code a `.keras` file asks Keras to run, in words ("a Lambda
    layer 'x' calling the function 'double'", "the function builtins.eval,
    the activation of layer 'd'"), when that is why loading failed: a
    Python lambda (which safe_mode refuses), or a function that is neither
    Keras' nor registered by name ('package>name': the user's own, to
    import); else None."""
    if "`Lambda` layer whose `function` is a Python lambda" in text:
        found = _function_references(path, lambda ref: ref.get("class_name") == "__lambda__")
        where = next((layer for layer, _, _ in found), None)
        return (f"a Lambda layer {where!r} holding Python bytecode" if where
                else "a Lambda layer holding Python bytecode")
    if not missing or not missing.group(0).startswith("Could not locate function"):
        return None
    name = missing.group(1)
    if ">" in name:  # a registered custom function: its module is to import
        return None
    found = _function_references(path, lambda ref: ref.get("class_name") == "function"
                                 and name in (ref.get("config"), ref.get("registered_name")))
    if not found:
        return f"the function {name!r}"
    layer, key, module = found[0]
    if key == "function":  # Lambda(function=...)
        return f"a Lambda layer {layer!r} calling the function {name!r}"
    function = f"{module}.{name}" if module else repr(name)
    return f"the function {function}, the {key} of layer {layer!r}"


def _function_references(path, wanted):
    """`(layer name, config key, module)` for every serialized function in
    the `config.json` of `path` that `wanted(reference)` accepts, in file
    order; [] when the config cannot be read."""
    try:
        with zipfile.ZipFile(path) as archive:
            if archive.getinfo("config.json").file_size > 64 << 20:
                return []
            config = json.loads(archive.read("config.json"))
    except (KeyError, ValueError, OSError, zipfile.BadZipFile):
        return []
    found = []

    def walk(node, layer, key):
        if isinstance(node, dict):
            if isinstance(node.get("class_name"), str) and wanted(node):
                found.append((layer, key, node.get("module")))
                return
            inner = node.get("config")
            if (isinstance(node.get("class_name"), str) and isinstance(inner, dict)
                    and isinstance(inner.get("name"), str)):
                layer = inner["name"]
            for child_key, child in node.items():
                walk(child, layer, child_key if child_key != "config" else key)
        elif isinstance(node, list):
            for child in node:
                walk(child, layer, key)

    try:
        walk(config, None, None)
    except RecursionError:  # a config nested deeper than any model's
        pass
    return found


def save_atomically(model, path):
    """`model.save(path)` through a temporary `.keras` file in the same
    folder, renamed into place: a kill never leaves a partial file at
    `path`."""
    directory, name = os.path.split(os.fspath(path))
    temporary = os.path.join(directory or ".", f".{name}.tmp-{os.getpid()}.keras")
    try:
        with host_values(model):
            model.save(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


@contextlib.contextmanager
def host_values(model):
    """Makes every variable of `model` (and of its optimizer) readable in
    this process while the block runs, so that Keras can save it.

    On JAX, a variable split over devices of several processes
    (`ModelParallel` with the model axis across processes) holds only
    some of its pieces in each process, and reading it raises JAX's
    "spans non-addressable devices" error. Such variables are gathered
    whole (`process_allgather`, a collective: every process must enter
    this block at the same point, as every process of a `keras-vit train`
    job saves) and put in place of the variable's value until the block
    ends (nothing is assigned, nothing resharded; a `keras.StatelessScope`
    cannot do it: saving creates variables, which a stateless scope
    forbids). Elsewhere this does nothing.
    """
    import keras  # Keras (TensorFlow): `keras-vit --help` imports this module

    if keras.backend.backend() != "jax":
        yield
        return
    import jax  # the JAX backend only

    if jax.process_count() == 1:
        yield
        return
    from jax.experimental import multihost_utils

    optimizer = getattr(model, "optimizer", None)
    variables = list(model.variables) + list(getattr(optimizer, "variables", []) or [])
    mapping, seen = [], set()
    for variable in variables:
        value = variable.value
        if id(variable) in seen or not isinstance(value, jax.Array):
            continue
        seen.add(id(variable))
        if not (value.is_fully_addressable or value.is_fully_replicated):
            mapping.append((variable, multihost_utils.process_allgather(value, tiled=True)))
    with _compat.swapped_variable_values(mapping):
        yield
