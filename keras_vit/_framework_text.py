"""Every reading of a TensorFlow, Keras, TFLite, h5py or OpenVINO message, in one place.

Where a framework says what went wrong only in words (a tf.data Assert, a
decoder's complaint, a `.keras` file Keras cannot load, a converter's list
of ops), keras_vit reads those words here and nowhere else. Each function
names the message's shape and the version it was checked on, and has a
test in `tests/test_framework_text.py` that makes the installed framework
raise the real message and fails loudly when its wording changes.

Checked on: TensorFlow 2.21.0, Keras 3.15.1, h5py 3.14, OpenVINO 2026.4.

Nothing here imports a framework: the callers hand over the text.
"""

import collections
import re

# --- TensorFlow: tf.debugging.Assert, image decoders, op errors ------------------

_ESCAPE = re.compile(rb"\\([0-7]{1,3}|x[0-9a-fA-F]{1,2}|.)", re.DOTALL)
_ESCAPES = {b"n": b"\n", b"t": b"\t", b"r": b"\r", b"a": b"\a", b"b": b"\b", b"f": b"\f",
            b"v": b"\v"}


def unescape_assert_string(text):
    """Undoes the C escaping TensorFlow applies to a string it prints in an
    Assert message (`\\'`, `\\"`, `\\\\`, `\\n`, octal bytes; other
    characters, non-ASCII included, print as they are). Checked on
    TensorFlow 2.21.0."""
    def one(match):
        code = match.group(1)
        if code[:1] in b"01234567":
            return bytes([int(code, 8) & 0xFF])
        if code[:1] == b"x" and len(code) > 1:
            return bytes([int(code[1:], 16)])
        return _ESCAPES.get(code, code)

    return _ESCAPE.sub(one, text.encode("utf-8")).decode("utf-8", "replace")


def _datum(spec):
    if spec is str:
        return "(.*?)"
    if spec is int:
        return r"(-?\d+)"
    if isinstance(spec, tuple):
        return "".join(_datum(part) for part in spec)
    return re.escape(spec)


def assert_data(message, *data):
    """The values of the failed `tf.debugging.Assert(..., data)` in
    `message` (an `InvalidArgumentError`'s text), or None when it holds no
    such Assert.

    TensorFlow prints each datum between brackets, one space apart:
    `assertion failed: [Corrupt or non-image file] [dir/it\\'s.png] [...]`
    (strings C-escaped, numbers as they are). Each of `data` is a literal
    string (matched as is), `str` (a string datum, returned unescaped),
    `int` (an integer datum, returned as int), or a tuple of those making
    one datum (`("Label out of range [0, ", int, ") for")`). Checked on
    TensorFlow 2.21.0 (eager iteration, `model.fit`).
    """
    pattern = " ".join(rf"\[{_datum(spec)}\]" for spec in data)
    match = re.search(pattern, message, re.DOTALL)
    if match is None:
        return None
    kinds = [part for spec in data
             for part in (spec if isinstance(spec, tuple) else (spec,)) if part in (str, int)]
    return tuple(unescape_assert_string(value) if kind is str else int(value)
                 for kind, value in zip(kinds, match.groups(), strict=True))


# What TensorFlow's decoders say about bytes that look like an image but are not.
_DECODE = re.compile(
    r"(Invalid PNG[^\n\[]*|jpeg::Uncompress failed[^\n\[]*|Invalid JPEG data[^\n\[]*|"
    r"Invalid GIF data[^\n\[]*|Failed to decode GIF[^\n\[]*|"
    r"Number of channels inherent in the image[^\n\[]*|Unknown image file format[^\n\[]*|"
    r"Invalid BMP[^\n\[]*|Error in decoding[^\n\[]*)")


def decode_failure(message):
    """The sentence in which one of TensorFlow's image decoders refused
    bytes (`tf.io.decode_image` and the decoders per format), e.g.
    "Invalid PNG. Failed to initialize decoder.", "jpeg::Uncompress failed.
    Invalid JPEG data or crop window.", "Invalid GIF data (size 46), ...",
    "Number of channels inherent in the image must be 1, 3 or 4, was 0",
    "Unknown image file format. One of JPEG, ...": up to the end of its
    line or the `[[{{node ...}}]]` that follows; None when `message` has
    none. Checked on TensorFlow 2.21.0."""
    match = _DECODE.search(message)
    return match.group(1) if match else None


# What TensorFlow puts around an op's own sentence: the function and node it
# failed in, the op's name, and the Python stack before a graph op's sentence
# ("Graph execution error:", "Detected at node X defined at (most recent call
# last):", "File "...", line N, in f" lines).
_TF_INTERNALS = (
    re.compile(r"\{\{function_node [^}]*\}\}\s*"),
    re.compile(r"\[\[\{\{node [^}]*\}\}\]\]"),
    re.compile(r"\s*\[Op:\w+\](?: name: \S*)?"),
    re.compile(r"\s*\[\[[^\]]*\]\]"),
)
_GRAPH_STACK = re.compile(r'^\s*(Graph execution error:|Detected at node .*|File ".*", line \d+, '
                          r'in .*)\s*$', re.MULTILINE)


def op_error_sentence(message):
    """An `OpError`'s `message` without what TensorFlow wraps around the
    op's own sentence, on one line: the `{{function_node ...}}` prefix,
    `[[{{node ...}}]]`, `[Op:Name] name: ...`, and a graph function's
    Python stack ("Graph execution error:" / "Detected at node ..." /
    `File "...", line N, in f`). Empty when nothing else is left. Checked
    on TensorFlow 2.21.0 (eager ops, `tf.function`, tf.data iterators)."""
    message = _GRAPH_STACK.sub("", message)
    for pattern in _TF_INTERNALS:
        message = pattern.sub(" ", message)
    return re.sub(r"\s+", " ", message).strip(" ;:\n")


# Lines written by TensorFlow's C++ logging (glog/absl format: "I0000 00:00:...",
# "W1234 12:00:00.123 ..."), its pre-initialisation banner, and MLIR/converter
# debug output.
_NATIVE_LOG = re.compile(
    r"^(?:[IWEF]\d{4} [\d:.]+\s+\d+ [\w.+-]+:\d+\] "
    r"|WARNING: All log messages before absl::InitializeLog\(\)"
    r"|To enable the following instructions: .* rebuild TensorFlow"
    r"|INFO: (?:Created|Initialized) TensorFlow Lite"
    r"|loc\(|\s*(?:fused|callsite)\(|\s*at callsite\("
    r"|Summary on the non-converted ops:|\s*\* (?:Accepted|Non-Converted) dialects:"
    r"|Estimated count of arithmetic ops:|\s*- tfl\.|\s*\* \d+ ARITH ops"
    r"|fully_quantize: \d, inference_type: \d+, input_inference_type: \w+, "
    r"output_inference_type: \w+)")


def is_native_log_line(line):
    """Whether `line` (text written to file descriptor 2) is TensorFlow's
    C++ runtime talking: an absl/glog line (`E0000 00:00:1795.5 2290
    cuda_platform.cc:52] ...`), absl's "WARNING: All log messages before
    absl::InitializeLog() is called ..." banner, the CPU feature guard's
    "To enable the following instructions: ... rebuild TensorFlow", or the
    TFLite converter's MLIR debug lines. Checked on TensorFlow 2.21.0."""
    return _NATIVE_LOG.match(line) is not None


def says_disk_full(message):
    """Whether an error's text says the disk is full, as TensorFlow's file
    ops ("{{function_node __wrapped__WriteFile_...}} /dev/full; No space
    left on device [Op:WriteFile]", a `ResourceExhaustedError`) and h5py
    ("Unable to synchronously create file (file write failed: ..., error
    message = 'No space left on device', ...)") put it. Checked on
    TensorFlow 2.21.0 and h5py 3.14.0."""
    return "No space left on device" in message


# --- Keras: why a .keras file did not load ----------------------------------------

Unlocated = collections.namedtuple("Unlocated", "kind name registered_name")
_UNREGISTERED = re.compile(r"Could not locate (class|function) '([^']+)'")
_REGISTERED_AS = re.compile(r"'registered_name': '([^']+)'")


def keras_unlocated(text):
    """`Unlocated(kind, name, registered_name)` when `keras.saving.load_model`
    failed because it found no class or function of that name, else None.

    Keras says "Could not locate class 'Tokenizer'. Make sure custom
    classes and functions are decorated with ... Full object config:
    {'module': None, 'class_name': 'Tokenizer', ..., 'registered_name':
    'keras_vit>Tokenizer'}": `kind` is "class" or "function", `name` the
    one it names, `registered_name` the first one in the object's config
    after it (None when there is none). Checked on Keras 3.15.1.
    """
    missing = _UNREGISTERED.search(text)
    if missing is None:
        return None
    registered = _REGISTERED_AS.search(text, missing.end())  # its own config
    return Unlocated(missing.group(1), missing.group(2),
                     registered.group(1) if registered else None)


def keras_refused_lambda(text):
    """Whether `keras.saving.load_model` refused, in safe mode, a Lambda
    layer holding Python bytecode ("Requested the deserialization of a
    `Lambda` layer whose `function` is a Python lambda. This carries a
    potential risk ..."). Checked on Keras 3.15.1."""
    return "`Lambda` layer whose `function` is a Python lambda" in text


_NOT_LOADED = re.compile(r"A total of (\d+) objects could not be loaded\. Example error "
                         r"message for object <(\w+) name=([^,>]+)[^>]*>:\s*\n\s*(\S[^\n]*)")


def keras_weights_refused(text):
    """`(count, class, name, cause)` when `keras.saving.load_model` could
    not load the weights of `count` objects, else None.

    Keras says "A total of 1 objects could not be loaded. Example error
    message for object <ClassifierHead name=head, built=True>:\\n\\nLayer
    'head' expected 3 variables, ..."; `cause` is the first line of the
    object's message. Checked on Keras 3.15.1.
    """
    match = _NOT_LOADED.search(text)
    if match is None:
        return None
    count, cls, name, cause = match.groups()
    return int(count), cls, name, cause


_ENCOUNTERED = "Exception encountered: "
_GENERIC = "could not be deserialized properly"
# A layer's own config at the start of one of Keras' nested messages: its
# class and name ("'class_name': 'ClassifierHead', 'config': {'name': 'head'"),
# or "Error when deserializing class 'Patches' using config={'name': 'patches'".
_LAYER = re.compile(r"'module': '([^']*)', 'class_name': '(\w+)', 'config': \{'name': '([^']*)'"
                    r"|Error when deserializing class '(\w+)' using config=\{'name': '([^']*)'")
_NOT_LAYERS = ("keras.initializers", "keras.regularizers", "keras.constraints")


def keras_config_refused(text):
    """`((class, layer name) or None, cause)` when building a model from
    its config failed with a cause of its own, else None (also when Keras
    said nothing more than its generic advice).

    Keras nests one message per object being deserialized, each ending in
    "Exception encountered: <what the inner one said>"; the innermost is
    the cause (e.g. keras_vit's "1 class names for a head with 3 classes;
    ..."), unless it is the generic "... could not be deserialized
    properly". The layer is the innermost one named before it, as
    "'module': 'keras_vit', 'class_name': 'ClassifierHead', 'config':
    {'name': 'head'" or "Error when deserializing class 'Patches' using
    config={'name': 'patches'" (dtype policies, initializers, regularizers
    and constraints are passed over). Checked on Keras 3.15.1.
    """
    if _ENCOUNTERED not in text:
        return None
    before, cause = text.rsplit(_ENCOUNTERED, 1)
    cause = cause.strip().splitlines()[0].strip() if cause.strip() else ""
    if not cause or _GENERIC in cause:
        return None
    layer = None
    for match in _LAYER.finditer(before):
        module, cls, name, cls2, name2 = match.groups()
        if cls2:
            layer = (cls2, name2)
        elif not (cls.endswith("DTypePolicy") or module.startswith(_NOT_LAYERS)):
            layer = (cls, name)
    return layer, cause


# --- Keras: model.quantize ------------------------------------------------------

# The leaf layers of keras_vit models that Keras' `model.quantize(mode)`
# leaves in float (it quantizes the blocks' Dense layers): keras_vit's own,
# without weights or with weights Keras does not quantize (the patch and
# position embeddings, LayerScale, the head, a ResNet stem's convolutions),
# and Keras' own (the input, dropout, the norms, pooling, reshapes).
QUANTIZE_LEAVES_FLOAT = (
    "ClassifierHead", "DropPath", "FeatureMap", "ImageNormalization", "LayerScale",
    "PatchEncoder", "Patches", "SequencePooling", "StdConv2D",
    "InputLayer", "Dropout", "LayerNormalization", "GroupNormalization", "MaxPooling2D",
    "Reshape")
# Keras 3.13-3.15 warns for each class of them ("Layer Patches does not have
# a `quantize` method implemented."), a UserWarning a user can do nothing
# about; `keras_vit.layers` hides exactly these (a `warnings.filterwarnings`
# message pattern). Checked on Keras 3.15.1 (tests/test_quiet.py; a later
# Keras gives one summary warning instead, which that test then shows).
QUANTIZE_SKIPPED = (rf"Layer ({'|'.join(QUANTIZE_LEAVES_FLOAT)}) does not have a `quantize` "
                    r"method implemented\.\Z")


# --- converters: TFLite, OpenVINO -------------------------------------------------


def tflite_unsupported_ops(message):
    """The sorted names of the ops a TFLite `ConverterError` says have no
    built-in kernel: those listed after "TF Select ops: " (or "Flex ops: ")
    and each `tf.Name(` of its "Details:" lines (custom ops such as
    `tf.Svd(` included); [] when it lists none. Checked on TensorFlow
    2.21.0 (`TFLiteConverter` with `TFLITE_BUILTINS` only)."""
    names = re.findall(r"tf\.([A-Za-z0-9_]+)\(", message)
    listed = re.search(r"(?:TF Select ops|Flex ops): ([^\n]+)", message)
    if listed:
        names += [n.strip() for n in listed.group(1).split(",")]
    return sorted(set(n for n in names if n))


def openvino_unconverted_ops(message):
    """What OpenVINO's `OpConversionFailure` lists after "No conversion
    rule found for operations: " (e.g. "AsString, StringToNumber, Svd"),
    stripped; None when it lists nothing. Checked on OpenVINO 2026.4
    (`openvino.convert_model` of a `tf.function`)."""
    found = re.search(r"No conversion rule found for operations: ([^\n]+)", message)
    return found.group(1).strip() if found else None
