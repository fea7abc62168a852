"""Each reading of a framework's message in keras_vit/_framework_text.py, fed
the real message of the installed TensorFlow / Keras / OpenVINO: a test
here fails loudly when the wording a function reads changes.

The sites' own sentences are covered where they are made: tests/test_data.py
(-k corrupt), test_data_edges.py, test_console.py, test_saving.py and
test_trust_keras_files.py."""

import json
import os
import subprocess
import sys
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit import _compat
from keras_vit import _framework_text as text

# The Assert data make_dataset's checks print (keras_vit/data/pipeline.py).
CORRUPT = "Corrupt or non-image file"
CORRUPT_END = "(pass skip_corrupt=True to skip and count such records)"
# A file name with every character TensorFlow escapes, and brackets.
NAME = "dir/it's \"x\"\\] [y]\té\n\x01.png"


def _error_of(dataset):
    """The `InvalidArgumentError` iterating `dataset` raises."""
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        for _ in dataset:
            pass
    return info.value


def _asserting(*data):
    """A one-record dataset whose map fails the Assert of `data` (`NAME`
    and -1 stand for the record's name and label)."""
    def check(name, label):
        values = [name if d is NAME else label if d == -1 else d for d in data]
        with tf.control_dependencies([tf.debugging.Assert(False, values)]):
            return tf.identity(name)

    return tf.data.Dataset.from_tensor_slices(([NAME], [-1])).map(check)


# --- TensorFlow ---------------------------------------------------------------------

@pytest.mark.parametrize("data, spec, values", [
    ((CORRUPT, NAME, CORRUPT_END), (CORRUPT, str, CORRUPT_END), (NAME,)),
    (("Label out of range [0, 3) for", NAME, "label", -1),
     (("Label out of range [0, ", int, ") for"), str, "label", int), (3, NAME, -1)),
    (("Image file too large", NAME, "height", 30000, "width", 20000, "bound", 178956970),
     ("Image file too large", str, "height", int, "width", int, "bound", int),
     (NAME, 30000, 20000, 178956970)),
], ids=["corrupt", "label", "too_large"])
def test_assert_data_reads_a_tf_data_assert(data, spec, values):
    message = _error_of(_asserting(*data)).message
    assert "assertion failed: [" in message
    assert text.assert_data(message, *spec) == values
    assert text.assert_data(message, "Something else", str) is None


def test_assert_data_reads_the_assert_model_fit_raises():
    images = tf.data.Dataset.from_tensor_slices((np.zeros((2, 4), "float32"), [0, 1]))

    def check(x, y):
        failed = tf.debugging.Assert(False, [CORRUPT, tf.constant(NAME), CORRUPT_END])
        with tf.control_dependencies([failed]):
            return tf.identity(x), y

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        model.fit(images.map(check).batch(2), epochs=1, verbose=0)
    assert text.assert_data(info.value.message, CORRUPT, str, CORRUPT_END) == (NAME,)


@pytest.mark.parametrize("data, said", [
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "Invalid PNG. Failed to initialize decoder."),
    (b"\xff\xd8\xff\xe0" + b"\0" * 40,
     "jpeg::Uncompress failed. Invalid JPEG data or crop window."),
    (b"GIF89a" + b"\0" * 40,
     "Invalid GIF data (size 46), failed to slurp gif file: Wrong record type detected"),
    (b"BM" + b"\0" * 60, "Number of channels inherent in the image must be 1, 3 or 4, was 0"),
    (b"junk" * 10,
     "Unknown image file format. One of JPEG, JPEG XL, PNG, GIF, BMP, WebP required."),
], ids=["png", "jpeg", "gif", "bmp", "unknown"])
def test_decode_failure_reads_what_each_decoder_says(data, said):
    dataset = tf.data.Dataset.from_tensors(data).map(
        lambda x: tf.io.decode_image(x, channels=3, expand_animations=False))
    message = _error_of(dataset).message
    assert text.decode_failure(message) == said
    assert text.decode_failure("assertion failed: [x]") is None


def _op_errors():
    """The same decoder failure raised by an eager op, a `tf.function` and a
    tf.data iterator."""
    errors = []
    try:
        tf.io.decode_png(b"xx")
    except tf.errors.InvalidArgumentError as error:
        errors.append(error)

    @tf.function
    def decode(x):
        return tf.io.decode_png(x)

    try:
        decode(tf.constant(b"xx"))
    except tf.errors.InvalidArgumentError as error:
        errors.append(error)
    errors.append(_error_of(tf.data.Dataset.from_tensors(b"xx").map(tf.io.decode_png)))
    return errors


def test_op_error_sentence_keeps_only_the_ops_own_sentence():
    eager, graph, iterator = _op_errors()
    said = "Unknown image file format. One of JPEG, JPEG XL, PNG, GIF, BMP, WebP required."
    assert "{{function_node" in eager.message and "[Op:DecodePng]" in eager.message
    assert text.op_error_sentence(eager.message) == said
    assert graph.message.startswith("Graph execution error:")
    assert "Detected at node" in graph.message and 'File "' in graph.message
    assert "[[{{node DecodePng}}]]" in graph.message
    assert text.op_error_sentence(graph.message) == said
    sentence = text.op_error_sentence(iterator.message)
    assert sentence.startswith("Error in user-defined function passed to MapDataset:")
    assert sentence.endswith(f" transformation with iterator: Iterator::Root::ParallelMapV2: "
                             f"{said}")


def test_is_native_log_line_knows_every_line_tensorflow_logs_at_start():
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", "import tensorflow as tf; tf.constant(1) + 1"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", ABSL_MIN_LOG_LEVEL="0"))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert any(line.startswith("WARNING: All log messages before absl::InitializeLog()")
               for line in lines), lines
    assert any(line[:1] in "IWEF" and line[1:5].isdigit() for line in lines), lines
    assert [line for line in lines if not text.is_native_log_line(line)] == []
    assert not text.is_native_log_line("keras-vit: error: Model not found: 'x.keras'.")


def test_says_disk_full_reads_tensorflows_and_h5pys_enospc():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with pytest.raises(tf.errors.ResourceExhaustedError) as info:
        tf.io.write_file("/dev/full", b"x" * 100_000)
    assert text.says_disk_full(str(info.value))
    h5py = pytest.importorskip("h5py")
    with pytest.raises(OSError) as info:  # noqa: PT011 - h5py's OSError carries errno 28
        with h5py.File("/dev/full", "w") as file:
            file["a"] = np.zeros(100_000)
    assert text.says_disk_full(str(info.value))
    assert not text.says_disk_full("Permission denied")


# --- Keras: loading a .keras file ----------------------------------------------------

@keras.saving.register_keras_serializable(package="framework_text_test")
class Picky(keras.layers.Layer):
    """A layer that refuses a config, as keras_vit's layers do."""

    def __init__(self, units=2, **kwargs):
        super().__init__(**kwargs)
        if units <= 0:
            raise ValueError(f"`units` must be positive, got {units}.")
        self.units = units

    def get_config(self):
        return {**super().get_config(), "units": self.units}

    def call(self, x):
        return x


def _load_error(tmp_path, outputs, edit=None):
    """The message `keras.saving.load_model` raises for a saved
    `Model(Input((4,)), outputs(input))`, its config.json changed by `edit`."""
    path = tmp_path / "m.keras"
    inputs = keras.Input((4,))
    keras.Model(inputs, outputs(inputs)).save(path)
    if edit:
        with zipfile.ZipFile(path) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        config = json.loads(members["config.json"])
        edit({layer["config"]["name"]: layer for layer in config["config"]["layers"]})
        members["config.json"] = json.dumps(config).encode()
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in members.items():
                archive.writestr(name, data)
    with pytest.raises(Exception) as info:  # noqa: B017, PT011 - Keras' own types vary
        keras.saving.load_model(path)
    return str(info.value).strip()


def test_keras_config_refused_names_the_layer_and_its_cause(tmp_path):
    said = _load_error(tmp_path, lambda x: Picky(name="p")(keras.layers.Dense(3, name="d")(x)),
                       lambda layers: layers["p"]["config"].__setitem__("units", 0))
    assert text.keras_config_refused(said) == (("Picky", "p"), "`units` must be positive, got 0.")
    assert text.keras_unlocated(said) is None and text.keras_weights_refused(said) is None


def test_keras_unlocated_reads_a_class_and_its_registered_name(tmp_path):
    said = _load_error(tmp_path, lambda x: Picky(name="p")(x),
                       lambda layers: layers["p"].__setitem__("registered_name", "gone>Picky"))
    assert text.keras_unlocated(said) == ("class", "Picky", "gone>Picky")


def test_keras_unlocated_reads_a_function(tmp_path):
    function = {"module": "builtins", "class_name": "function", "config": "eval",
                "registered_name": "function"}
    said = _load_error(tmp_path, lambda x: keras.layers.Dense(2, name="d")(x),
                       lambda layers: layers["d"]["config"].__setitem__("activation", function))
    assert text.keras_unlocated(said) == ("function", "eval", "function")


def test_keras_refused_lambda_reads_safe_modes_refusal(tmp_path):
    said = _load_error(tmp_path, lambda x: keras.layers.Lambda(lambda y: y * 2, name="x")(x))
    assert text.keras_refused_lambda(said)
    assert not text.keras_refused_lambda("Could not locate class 'Picky'.")


def test_keras_weights_refused_reads_the_first_objects_message(tmp_path):
    with pytest.warns(UserWarning):  # Keras: "Skipping nested container ..."
        said = _load_error(tmp_path, lambda x: keras.layers.Dense(2, name="d")(x),
                           lambda layers: layers["d"]["config"].__setitem__("use_bias", False))
    assert text.keras_weights_refused(said) == (
        1, "Dense", "d",
        "Layer 'd' expected 1 variables, but received 2 variables during loading. "
        "Expected: ['kernel']")
    assert text.keras_config_refused(said) is None


# --- converters ------------------------------------------------------------------------

@tf.function(input_signature=[tf.TensorSpec([4, 4], tf.float32)])
def _no_builtin_kernels(x):
    """AsString and StringToNumber (TF Select ops) and Svd (a custom op)."""
    return tf.linalg.svd(x)[0] + tf.strings.to_number(tf.strings.as_string(x))


def test_tflite_unsupported_ops_reads_the_converters_error():
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [_no_builtin_kernels.get_concrete_function()], _no_builtin_kernels)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    with pytest.raises(_compat.tflite_converter_error()) as info:
        converter.convert()
    assert "TF Select ops: AsString, StringToNumber" in str(info.value)
    assert text.tflite_unsupported_ops(str(info.value)) == ["AsString", "StringToNumber", "Svd"]
    assert text.tflite_unsupported_ops("failed") == []


def test_openvino_unconverted_ops_reads_the_frontends_error():
    ov = pytest.importorskip("openvino")  # the [openvino] extra
    with pytest.raises(Exception) as info:  # noqa: B017, PT011 - OpConversionFailure
        ov.convert_model(_no_builtin_kernels)
    assert text.openvino_unconverted_ops(str(info.value)) == "AsString, StringToNumber, Svd"
    assert text.openvino_unconverted_ops("Model wasn't fully converted.") is None


def test_quantize_skipped_is_the_warning_keras_gives_for_a_layer_it_leaves_in_float():
    """Keras' own layers of the pattern, in a plain Keras model (the
    keras_vit models' warnings: tests/test_quiet.py)."""
    import re
    import warnings

    inputs = keras.Input((4, 4, 2))
    x = keras.layers.MaxPooling2D()(inputs)
    x = keras.layers.GroupNormalization(groups=1)(x)
    x = keras.layers.Reshape((4, 2))(x)
    x = keras.layers.LayerNormalization()(x)
    x = keras.layers.Dropout(0.1)(x)
    model = keras.Model(inputs, keras.layers.Dense(3)(x))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        model.quantize("int8")
    said = {str(w.message) for w in caught if issubclass(w.category, UserWarning)}
    assert said == {f"Layer {name} does not have a `quantize` method implemented."
                    for name in ("InputLayer", "MaxPooling2D", "GroupNormalization",
                                 "Reshape", "LayerNormalization", "Dropout")}
    assert all(re.match(text.QUANTIZE_SKIPPED, message) for message in said)
    assert not re.match(text.QUANTIZE_SKIPPED, "Layer Conv2D does not have a `quantize` "
                                                "method implemented.")
