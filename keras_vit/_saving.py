"""Loading `.keras` files with one clear sentence for each way it can fail
(what the CLI, `train` and `evaluate` use): not a `.keras` name, missing,
a directory, present but unreadable (not a zip archive: truncated, or
another file renamed), a class that is not registered (keras_vit's, or
the user's own), or code the file asks to run (a Lambda layer, a function
outside Keras), which safe_mode refuses, or a layer's own refusal (its
cause and the layer named, not Keras' generic advice); a file that would
make Keras allocate what its bytes do not hold (a compressed member, a
config.json or an input image larger than the bounds, a config asking
for more weights than its weights file holds) is refused before Keras
reads it (`check_keras_archive`); and writing them so that a kill
never leaves a partial file, from every process of a multi-process JAX
job."""

import contextlib
import json
import os
import zipfile

import keras_vit
from keras_vit import _atomic, _checks, _compat, _framework_text
from keras_vit.weights.sniff import MAX_CHECKPOINT_BYTES_ENV, max_checkpoint_bytes

MAX_CONFIG_BYTES = 16 << 20  # a .keras file's config.json (ViT-H/14's: under 100 KB)
MAX_EXPANSION = 10  # Keras stores members uncompressed: a member over 64 MiB may be
_EXPANSION_FLOOR = 64 << 20  # compressed at most 10:1 (a zip tool's deflate: about 1.1:1)
_WEIGHTS_MEMBERS = ("model.weights.h5", "model.weights.npz")


def check_keras_path(path, what="MODEL"):
    """`path` as a string if it names an existing, readable `.keras` file;
    else a ValueError saying which of those it is not."""
    path = str(path)
    if path.endswith(".npz"):
        raise ValueError(
            f"{what} must be a .keras file written by keras-vit train or model.save; got "
            f"{path!r} (an official checkpoint: make a .keras file of it in Python with "
            f"keras_vit.model_from_checkpoint({path!r}).save("
            f"{os.path.splitext(path)[0] + '.keras'!r}); keras-vit predict reads it as it "
            f"is with --model auto --weights {path}).")
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
            if archive.getinfo("config.json").file_size > MAX_CONFIG_BYTES:
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
    check_keras_archive(path)
    keras_vit._load_all()  # registers every keras_vit class
    try:
        return keras.saving.load_model(path)
    except (ValueError, TypeError, OSError, KeyError, zipfile.BadZipFile) as error:
        text = str(error).strip()
        missing = _framework_text.keras_unlocated(text)
        code = _code_asked_for(path, text, missing)
        if code:
            raise ValueError(
                f"Cannot load {path!r}: the file asks to run code that is not part of "
                f"Keras or keras_vit ({code}), and loading in safe_mode refuses it. A "
                "model keras_vit writes never holds code; load .keras files only from a "
                "source you trust.") from None
        if missing:
            name = missing.registered_name or missing.name  # its own config's name first
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
        layer, cause, failed = _layer_cause(text)
        if cause:
            where = f"its layer {layer[1]!r} ({layer[0]})" if layer else "Keras"
            raise ValueError(f"Cannot load {path!r}: {where} {failed}: {cause}") from None
        first = _printable(text.splitlines()[0]) if text else type(error).__name__
        raise ValueError(f"Cannot load {path!r} as a Keras model: {first}") from error


def _layer_cause(text):
    """`((class, layer name) or None, cause, what failed)` from Keras'
    load error `text`, or `(None, None, None)` when Keras said nothing more
    than its generic advice:

    - building from the config (nested "Exception encountered:" messages):
      the cause is what the innermost object said (e.g. keras_vit's "1
      class names for a head with 3 classes; ..."), the layer the innermost
      one being deserialized around it;
    - reading the weights ("A total of 1 objects could not be loaded.
      Example error message for object <ClassifierHead name=head, ...>:"):
      that object and its message.
    """
    loaded = _framework_text.keras_weights_refused(text)
    if loaded:
        count, cls, name, cause = loaded
        others = count - 1
        return (cls, name), _sentence(cause), "does not fit its weights" + (
            f" (and {others} other layer{'s' * (others > 1)})" if others else "")
    refused = _framework_text.keras_config_refused(text)
    if refused is None:
        return None, None, None
    layer, cause = refused
    return layer, _sentence(cause), "refused its config"


def _sentence(cause):
    """`cause` (one line of Keras' or a layer's message) printable, ending
    in a full stop."""
    cause = cause.strip()
    return _printable(cause if cause.endswith((".", "?", "!")) else cause + ".")


def _printable(text):
    """`text` with every character a terminal would act on (a line break,
    an ANSI escape: `label_line_problem`) written as its escape: what a
    file says reaches the terminal as text."""
    return "".join(repr(char)[1:-1] if _checks.label_line_problem(char) else char
                   for char in text)


def check_keras_archive(path):
    """Refuses the `.keras` file at `path` (a zip archive) before Keras
    reads it when it would make Keras allocate what its bytes do not hold,
    in one ValueError naming the file:

    - a `config.json` or `metadata.json` declaring more than
      `MAX_CONFIG_BYTES` (16 MiB; a keras_vit model's is under 1 MB);
    - a member declaring more than 64 MiB and more than `MAX_EXPANSION`
      (10) times the bytes it stores (Keras stores members uncompressed;
      a decompression bomb);
    - members declaring more than `$KERAS_VIT_MAX_CHECKPOINT_BYTES` (16
      GiB) in all;
    - a model input image of more than `$KERAS_VIT_MAX_IMAGE_PIXELS`
      pixels (every image is resized to it);
    - a config asking for more weights than its weights member holds (a
      position embedding, a Dense kernel: counted from the config, at
      half a byte each, the smallest Keras stores).
    """
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
        for info in members:
            if info.filename in ("config.json", "metadata.json") and \
                    info.file_size > MAX_CONFIG_BYTES:
                raise ValueError(
                    f"Cannot load {path!r}: its {info.filename} declares "
                    f"{info.file_size:,} bytes, more than the {MAX_CONFIG_BYTES:,} a model's "
                    "may (a keras_vit model's is under 1 MB); the file is damaged or not "
                    "a model's.")
            if info.file_size > max(_EXPANSION_FLOOR, MAX_EXPANSION * info.compress_size):
                raise ValueError(
                    f"Cannot load {path!r}: its member {_printable(info.filename)!r} "
                    f"declares {info.file_size:,} bytes but stores {info.compress_size:,} "
                    f"(more than {MAX_EXPANSION}:1; Keras stores members uncompressed): a "
                    "decompression bomb or a damaged file.")
        total, limit = sum(info.file_size for info in members), max_checkpoint_bytes()
        if total > limit:
            raise ValueError(
                f"Cannot load {path!r}: its members declare {total:,} bytes, more than the "
                f"limit of {limit:,} ({MAX_CHECKPOINT_BYTES_ENV}); set "
                f"{MAX_CHECKPOINT_BYTES_ENV} higher to read it.")
        try:
            config = json.loads(archive.read("config.json"))
        except (KeyError, ValueError, RecursionError):
            return  # no config, or not JSON: Keras says so
        weights = next((archive.getinfo(name).file_size for name in _WEIGHTS_MEMBERS
                        if name in archive.namelist()), None)
    layers = []
    try:
        _collect_layers(config, layers)
    except RecursionError:  # a config nested deeper than any model's: Keras says so
        return
    pixels_limit = _checks.max_image_pixels()
    needed, largest = 0, (0, None, None)
    for cls, layer in layers:
        name = _printable(str(layer.get("name")))
        if cls == "InputLayer":
            shape = _dims(layer.get("batch_shape") or layer.get("batch_input_shape"))
            if shape and len(shape) == 4 and None not in shape[1:]:
                height, width = sorted(shape[1:])[1:]  # channels first or last
                if height * width > pixels_limit:
                    raise ValueError(
                        f"Cannot load {path!r}: its model takes {height:,} x {width:,}-pixel "
                        f"images (input {name!r}), more than the limit of {pixels_limit:,} "
                        f"pixels ({_checks.MAX_IMAGE_PIXELS_ENV}); set "
                        f"{_checks.MAX_IMAGE_PIXELS_ENV} higher to use it.")
        count, what = _weights_asked(layer)
        needed += count
        if count > largest[0]:
            largest = (count, name, what)
    if weights is not None and needed > 2 * weights:
        count, name, what = largest
        raise ValueError(
            f"Cannot load {path!r}: its config.json asks for at least {needed:,} weights "
            f"(layer {name!r}: {what}), more than its {weights:,}-byte weights file "
            "holds; the file is damaged or was edited.")


def _collect_layers(node, found):
    """Appends `(class name, config)` of every object in a `.keras` config
    that has a dict `config` and a `build_config` or is an input layer
    (nested models' layers too)."""
    if isinstance(node, dict):
        config = node.get("config")
        if isinstance(node.get("class_name"), str) and isinstance(config, dict) and (
                node["class_name"] == "InputLayer" or "build_config" in node):
            build = node.get("build_config")
            shape = build.get("input_shape") if isinstance(build, dict) else None
            found.append((node["class_name"], {**config, "_input_shape": shape}))
        for child in node.values():
            _collect_layers(child, found)
    elif isinstance(node, list):
        for child in node:
            _collect_layers(child, found)


def _dims(shape):
    """`shape` (a JSON list) as a tuple of positive ints and None, or None
    when it is something else."""
    if not isinstance(shape, list) or not all(
            d is None or (isinstance(d, int) and not isinstance(d, bool) and d > 0)
            for d in shape):
        return None
    return tuple(shape)


def _weights_asked(layer):
    """`(count, what)`: a lower bound on the weights a layer of config
    `layer` creates, from the sizes it names (a position embedding's grid,
    a Dense kernel's units and input width, a block's MLP), and in words."""
    def size(key):
        value = layer.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and \
            value > 0 else 0

    shape = layer.get("_input_shape")
    shape = _dims(shape[0] if isinstance(shape, list) and shape and
                  isinstance(shape[0], list) else shape)
    width = shape[-1] if shape and shape[-1] is not None else 0
    grid = _dims(layer.get("grid_size"))
    if size("hidden_size") and grid and None not in grid:
        tokens = 1
        for d in grid:
            tokens *= d
        return tokens * size("hidden_size"), (
            f"a position embedding of {' x '.join(map(str, grid))} x {size('hidden_size')}")
    if size("units") and width:
        return width * size("units"), f"a {width} x {size('units')} kernel"
    if size("mlp_dim") and width:
        return 2 * width * size("mlp_dim"), f"an MLP of {width} x {size('mlp_dim')}, twice"
    if size("tokens_mlp_dim") and shape and len(shape) == 3 and shape[1]:
        return 2 * shape[1] * size("tokens_mlp_dim"), (
            f"a token MLP of {shape[1]} x {size('tokens_mlp_dim')}, twice")
    return 0, None


def _code_asked_for(path, text, missing):
    """What code a `.keras` file asks Keras to run, in words ("a Lambda
    layer 'x' calling the function 'double'", "the function builtins.eval,
    the activation of layer 'd'"), when that is why loading failed: a
    Python lambda (which safe_mode refuses), or a function that is neither
    Keras' nor registered by name ('package>name': the user's own, to
    import); else None."""
    if _framework_text.keras_refused_lambda(text):
        found = _function_references(path, lambda ref: ref.get("class_name") == "__lambda__")
        where = next((layer for layer, _, _ in found), None)
        return (f"a Lambda layer {where!r} holding Python bytecode" if where
                else "a Lambda layer holding Python bytecode")
    if not missing or missing.kind != "function":
        return None
    name = missing.name
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
            if archive.getinfo("config.json").file_size > MAX_CONFIG_BYTES:
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


def without_optimizer(model):
    """`model` for saving without its training state: a compiled Functional
    or Sequential model becomes a Functional model of the same layers, the
    same config and the same weights (nothing copied), not compiled. Its
    `.keras` file then holds the architecture and the weights, but not the
    optimizer's variables (Adam's two slots per weight: two thirds of the
    file) nor a compile config, so loading it builds no optimizer, and a
    copy quantized (`model.quantize`) reloads without Keras' "Skipping
    variable loading for optimizer". An uncompiled model, and a subclassed
    one (no symbolic inputs), are returned as they are.

    Example:

    >>> import keras, keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3), classes=3)
    >>> model.compile(optimizer="adam", loss="categorical_crossentropy")
    >>> plain = without_optimizer(model)
    >>> plain.compiled, plain.get_config() == model.get_config()
    (False, True)
    >>> plain.weights[0] is model.weights[0]
    True
    """
    import keras  # Keras (TensorFlow): `keras-vit --help` imports this module

    if getattr(model, "optimizer", None) is None or not getattr(model, "inputs", None):
        return model
    return keras.Model(model.input, model.output, name=model.name)


def save_atomically(model, path):
    """`model.save(path)` through a temporary `.keras` file in the same
    folder, renamed into place: a kill never leaves a partial file at
    `path`."""
    # (Keras wants the suffix)
    with _atomic.renamed_into_place(path, ".keras") as temporary, host_values(model):
        model.save(temporary)


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
