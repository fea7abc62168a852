"""Each private framework hook in keras_vit/_compat.py, checked against the
installed Keras / TensorFlow / LiteRT: a test here fails loudly when the
assumption behind a hook stops holding."""

# --- saving, training and layers ---------------------------------------------
# Each test names the site its hook serves; the sites' own behaviour is covered
# by the tests named there. `_stale_message` is shared with the export section.

import contextlib
import json
import inspect
import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_vit import _compat

KERAS_3_15 = r".*which Keras \S+ does not provide as it did on Keras 3\.15\.1: "
TF_2_21 = r".*which TensorFlow \S+ does not provide as it did on TensorFlow 2\.21\.0: "


def _tiny_regressor():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


@pytest.mark.backends
def test_swapped_variable_values_is_what_value_and_saving_read(tmp_path):
    """`_saving.host_values` (covered by test_distribution.py::
    test_cli_train_in_two_processes_writes_one_run)."""
    model = _tiny_regressor()
    kernel = model.layers[0].kernel
    before = ops.convert_to_numpy(kernel)
    whole = np.arange(6, dtype="float32").reshape(3, 2)
    with _compat.swapped_variable_values([(kernel, ops.convert_to_tensor(whole))]):
        np.testing.assert_array_equal(ops.convert_to_numpy(kernel.value), whole)
        model.save_weights(str(tmp_path / "swapped.weights.h5"))
    np.testing.assert_array_equal(ops.convert_to_numpy(kernel), before)  # restored
    other = _tiny_regressor()
    other.load_weights(str(tmp_path / "swapped.weights.h5"))
    np.testing.assert_array_equal(ops.convert_to_numpy(other.layers[0].kernel), whole)
    with pytest.raises(RuntimeError, match=_stale_message("Variable._value") + KERAS_3_15):
        with _compat.swapped_variable_values([(object(), whole)]):
            pass


def test_in_multi_worker_mode_answers_for_one_process_strategies():
    """`training.strategy.is_multi_worker`; a two-worker strategy answers True in
    test_training.py::test_multi_worker_mirrored_two_processes_match_single_process
    (two processes: a multi-worker strategy waits for its peers)."""
    import tensorflow as tf

    assert callable(tf.distribute.StrategyExtended._in_multi_worker_mode)  # the public base
    assert _compat.in_multi_worker_mode(tf.distribute.get_strategy()) is False
    assert _compat.in_multi_worker_mode(tf.distribute.MirroredStrategy(["/cpu:0"])) is False

    class Strategy:
        extended = object()

    with pytest.raises(RuntimeError, match=_stale_message(
            "StrategyExtended._in_multi_worker_mode()") + TF_2_21):
        _compat.in_multi_worker_mode(Strategy())


def test_build_from_first_replica_is_the_build_fit_calls(monkeypatch):
    """`training.strategy.prepare_model` (covered by test_training.py::
    test_multi_worker_mirrored_two_processes_match_single_process)."""
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(2)])  # no Input: fit builds it
        model.compile(optimizer="sgd", loss="mse")
    built_from = []
    symbolic_build = model._symbolic_build
    monkeypatch.setattr(model, "_symbolic_build", lambda data_batch: (
        built_from.append(tf.nest.map_structure(lambda t: tuple(t.shape), data_batch)),
        symbolic_build(data_batch=data_batch)))
    assert _compat.build_from_first_replica(model, strategy) is model
    model.fit(np.ones((4, 3), "float32"), np.zeros((4, 2), "float32"), batch_size=2,
              epochs=1, verbose=0)
    assert built_from == [((2, 3), (2, 2))]  # once, from the first (x, y) batch
    assert model.built and model.layers[0].kernel.shape == (3, 2)
    with pytest.raises(RuntimeError, match=_stale_message("Model._maybe_symbolic_build")
                       + KERAS_3_15):
        _compat.build_from_first_replica(object(), strategy)


def test_build_before_fit_makes_fit_trace_its_step_once():
    """`training.engine.build_for_fit` (covered by test_training.py::
    test_train_traces_its_step_once). Without it, the optimizer's and the
    metrics' variables are created in the first trace and `tf.function`
    traces the step again."""
    import tensorflow as tf

    def fit_traces(build):
        model = keras.Sequential([keras.layers.Dense(2)])  # no Input: built from the spec
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        dataset = tf.data.Dataset.from_tensor_slices(
            (np.ones((4, 3), "float32"), np.zeros((4, 2), "float32"))).batch(2)
        if build:
            assert _compat.build_before_fit(model, dataset.element_spec) is model
            assert model.built and model.optimizer.built and model.layers[0].kernel.shape == (3, 2)
        traced, step = [], model.train_step
        model.train_step = lambda data: (traced.append(1), step(data))[1]
        model.fit(dataset, epochs=1, verbose=0)
        return len(traced)

    assert fit_traces(build=False) == 2  # Keras' own behaviour without a strategy
    assert fit_traces(build=True) == 1
    with pytest.raises(RuntimeError, match=_stale_message("Trainer._symbolic_build")
                       + KERAS_3_15):
        _compat.build_before_fit(object(), None)


def test_compute_loss_is_the_compiled_loss():
    """`training.sam.SAMModel._loss` (covered by test_training.py::
    test_sam_step_equals_the_hand_computed_reference)."""
    model = _tiny_regressor()
    x, y = np.ones((2, 3), "float32"), np.zeros((2, 2), "float32")
    y_pred = model(x)
    expected = float(np.mean(ops.convert_to_numpy(y_pred) ** 2))
    loss = _compat.compute_loss(model, x, y, y_pred, None)
    assert float(ops.convert_to_numpy(loss)) == pytest.approx(expected, rel=1e-6)
    with pytest.raises(RuntimeError, match=_stale_message("Trainer._compute_loss") + KERAS_3_15):
        _compat.compute_loss(object(), x, y, y_pred, None)


def test_update_loss_tracker_is_the_loss_fit_logs(monkeypatch):
    """`training.sam.SAMModel._tf_train_step` (covered by test_training.py::
    test_sam_with_fit_logs_loss_and_saves_the_inner_model and
    test_sam_under_mirrored_is_per_replica_m_sharpness)."""
    model = _tiny_regressor()
    _compat.update_loss_tracker(model, ops.convert_to_tensor(2.0), 1)
    _compat.update_loss_tracker(model, ops.convert_to_tensor(5.0), 2)
    assert model.metrics[0].name == "loss"
    assert float(model.get_metrics_result()["loss"]) == pytest.approx(4.0)  # (2 + 2 * 5) / 3
    uncompiled = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    _compat.update_loss_tracker(uncompiled, ops.convert_to_tensor(2.0), 1)  # nothing to add to
    with pytest.raises(RuntimeError, match=_stale_message("Trainer._loss_tracker") + KERAS_3_15):
        _compat.update_loss_tracker(object(), ops.convert_to_tensor(2.0), 1)
    from keras.src.losses import loss as loss_module

    monkeypatch.delattr(loss_module, "unscale_loss_for_distribution")
    with pytest.raises(RuntimeError, match=_stale_message(
            "keras.src.losses.loss.unscale_loss_for_distribution") + KERAS_3_15):
        _compat.update_loss_tracker(model, ops.convert_to_tensor(2.0), 1)


@pytest.mark.backends
def test_update_metrics_variables_is_the_jax_trainers_metric_update():
    """`training.sam.SAMModel._jax_train_step` (covered by test_distribution.py::
    test_sam_under_data_parallel_matches_a_hand_reference). On JAX the update
    itself; elsewhere the JAX trainer's method as the hook calls it."""
    if keras.backend.backend() != "jax":
        pytest.importorskip("jax")
        from keras.src.backend.jax.trainer import JAXTrainer

        assert list(inspect.signature(JAXTrainer._update_metrics_variables).parameters) == [
            "self", "metrics_variables", "unscaled_loss", "x", "y", "y_pred", "sample_weight"]
        return
    model = _tiny_regressor()
    x, y = np.ones((2, 3), "float32"), np.zeros((2, 2), "float32")
    model.fit(x, y, verbose=0)  # builds the metrics
    model.reset_metrics()
    state = [v.value for v in model.metrics_variables]
    logs, state = _compat.update_metrics_variables(
        model, state, ops.convert_to_tensor(3.0), x, y, model(x), None)
    assert float(logs["loss"]) == pytest.approx(3.0)
    assert len(state) == len(model.metrics_variables)
    assert float(model.get_metrics_result()["loss"]) == 0.0  # stateless: nothing assigned
    with pytest.raises(RuntimeError, match=_stale_message(
            "JAXTrainer._update_metrics_variables") + KERAS_3_15):
        _compat.update_metrics_variables(object(), state, 3.0, x, y, x, None)


def test_optimizer_learning_rate_is_what_the_optimizer_was_given():
    """`training.callbacks.unmoved_message` (covered by test_trainer_edges.py)."""
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    assert _compat.optimizer_learning_rate(keras.optimizers.SGD(schedule)) is schedule
    rate = _compat.optimizer_learning_rate(keras.optimizers.SGD(0.25))
    assert float(ops.convert_to_numpy(rate)) == 0.25
    with pytest.raises(RuntimeError, match=_stale_message("Optimizer._learning_rate")
                       + KERAS_3_15):
        _compat.optimizer_learning_rate(object())


def test_optimizer_variable_index_is_the_variables_position():
    """`training.layer_decay` (covered by test_finetune_tools.py)."""
    variables = [keras.Variable(np.zeros(2), name=n) for n in "abc"]
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(variables)
    assert [_compat.optimizer_variable_index(optimizer, v) for v in variables] == [0, 1, 2]
    with pytest.raises(RuntimeError, match=_stale_message("Optimizer._get_variable_index")
                       + KERAS_3_15):
        _compat.optimizer_variable_index(object(), variables[0])


def test_around_backup_save_wraps_each_backup_keras_writes(tmp_path):
    """`training.callbacks.BackupAndRestore` (covered by test_training.py::
    test_killed_training_resumes_from_the_backup)."""
    assert callable(keras.callbacks.BackupAndRestore._save_model)
    backup = str(tmp_path / "backup")
    written = []

    def temporaries():
        return sorted(name for name in os.listdir(backup) if ".tmp-" in name)

    class Backup(_compat.AroundBackupSave, keras.callbacks.BackupAndRestore):
        @contextlib.contextmanager
        def saving_context(self):
            before = os.path.exists(os.path.join(backup, "latest.weights.h5"))
            yield
            written.append((before, len(temporaries())))

    model = _tiny_regressor()
    model.fit(np.ones((4, 3), "float32"), np.zeros((4, 2), "float32"), epochs=2, verbose=0,
              callbacks=[Backup(backup, delete_checkpoint=False)])
    # one backup per epoch, written inside the context under two temporary
    # names, renamed into place after it
    assert written == [(False, 2), (True, 2)]
    assert os.path.exists(os.path.join(backup, "training_metadata.json"))
    assert temporaries() == []
    with open(os.path.join(backup, "training_metadata.json")) as f:
        last = json.load(f)
    assert last["epoch"] == 2

    class KilledWhileWriting(Backup):
        @contextlib.contextmanager
        def saving_context(self):
            yield
            raise KeyboardInterrupt  # Ctrl-C after Keras wrote, before the renames

    with pytest.raises(KeyboardInterrupt):
        model.fit(np.ones((4, 3), "float32"), np.zeros((4, 2), "float32"), epochs=3,
                  verbose=0, callbacks=[KilledWhileWriting(backup, delete_checkpoint=False)])
    with open(os.path.join(backup, "training_metadata.json")) as f:
        assert json.load(f) == last  # the last whole backup, untouched
    assert temporaries() == []

    class NotABackup(_compat.AroundBackupSave, keras.callbacks.Callback):
        pass

    with pytest.raises(RuntimeError, match=_stale_message("BackupAndRestore._save_model()")
                       + KERAS_3_15):
        NotABackup()


def test_in_xla_context_is_true_only_while_tracing_for_xla(monkeypatch):
    """`layers.fused.layer_norm` (covered by test_fused.py::
    test_xla_compiled_blocks_use_the_plain_layer_norm)."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    seen = []

    def probe(x):
        seen.append(_compat.in_xla_context())
        return x

    assert _compat.in_xla_context() is False  # eager
    tf.function(probe)(tf.ones(1))
    tf.function(probe, jit_compile=True)(tf.ones(1))
    assert seen == [False, True]
    monkeypatch.delattr(control_flow_util, "GraphOrParentsInXlaContext")
    with pytest.raises(RuntimeError, match=_stale_message(
            "tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext") + TF_2_21):
        _compat.in_xla_context()


# --- export --------------------------------------------------------------------
# keras, numpy, pytest and _compat are imported at the top of the file; the rest
# inside each test.


def _stale_message(what):
    """The start of the sentence a hook raises, as a `match=` pattern."""
    import re

    return rf"^keras_vit relies on {re.escape(what)}"


def test_build_shapes_reads_the_shapes_a_subclassed_model_was_built_with():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    assert _compat.build_shapes(model) is None  # Layer.__init__ sets it, to None
    model(np.zeros((1, 4, 4, 3), "float32"))  # built by its first call
    assert _compat.build_shapes(model) == {"input_shape": (1, 4, 4, 3)}
    sequential = keras.Sequential([keras.layers.Dense(2)])
    sequential.build((None, 5))
    assert _compat.build_shapes(sequential) == {"input_shape": (None, 5)}
    # what keras_vit.export makes of it: the input shape with a free batch
    from keras_vit.export.model import model_input_shape

    assert model_input_shape(model) == (None, 4, 4, 3)
    with pytest.raises(RuntimeError, match=_stale_message("Layer._build_shapes_dict")
                       + r".*which Keras \S+ does not provide as it did on Keras 3\.15\.1: "
                         r"keras_vit/_compat\.py needs updating for this release\.$"):
        _compat.build_shapes(object())


def test_attach_to_export_archive_is_restored_by_saved_model_load(tmp_path):
    import tensorflow as tf

    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    archive = keras.export.ExportArchive()
    archive.track(model)
    asset = tf.saved_model.Asset(str(tmp_path / "labels.txt"))
    archive.track(asset)
    _compat.attach_to_export_archive(archive, "labels", asset)
    archive.add_endpoint("serve", model.__call__,
                         input_signature=[tf.TensorSpec((None, 3), tf.float32)])
    archive.write_out(str(tmp_path / "saved"), verbose=False)
    (tmp_path / "labels.txt").unlink()  # the SavedModel holds its own copy
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    with open(loaded.labels.asset_path.numpy().decode()) as f:
        assert f.read() == "cat\ndog\n"
    assert loaded.serve(tf.zeros((1, 3))).shape == (1, 2)
    with pytest.raises(RuntimeError, match=_stale_message("ExportArchive._tf_trackable")):
        _compat.attach_to_export_archive(object(), "labels", asset)


def _tflite_bytes(fn, shape):
    import tensorflow as tf

    function = tf.function(fn, autograph=False).get_concrete_function(
        tf.TensorSpec(shape, tf.float32))
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter.convert()


def test_tflite_op_names_lists_each_node_of_a_litert_interpreter():
    pytest.importorskip("ai_edge_litert", reason="the [export] extra is not installed")
    from ai_edge_litert.interpreter import Interpreter

    content = _tflite_bytes(lambda x: x * 2.0 + 1.0, (1, 3))
    assert _compat.tflite_op_names(Interpreter(model_content=content)) == ["MUL", "ADD"]
    assert callable(Interpreter._get_ops_details)
    with pytest.raises(RuntimeError, match=_stale_message("Interpreter._get_ops_details()")
                       + r".*which ai-edge-litert \S+ does not provide as it did on "
                         r"ai-edge-litert 2\.3\.0"):
        _compat.tflite_op_names(object())


def test_freeze_concrete_function_turns_variables_into_constants(monkeypatch):
    import sys

    import tensorflow as tf

    weight = tf.Variable([[2.0], [3.0]])
    function = tf.function(lambda x: tf.matmul(x, weight)).get_concrete_function(
        tf.TensorSpec((None, 2), tf.float32))
    assert function.captured_inputs  # the variable, before
    frozen = _compat.freeze_concrete_function(function)
    assert not frozen.captured_inputs  # a graph of constants, after
    ops = {node.op for node in frozen.graph.as_graph_def().node}
    assert "Const" in ops and not ops & {"ReadVariableOp", "VarHandleOp"}
    np.testing.assert_array_equal(frozen(tf.constant([[1.0, 1.0]]))[0].numpy(), [[5.0]])
    monkeypatch.setitem(sys.modules, "tensorflow.python.framework.convert_to_constants", None)
    with pytest.raises(RuntimeError, match=_stale_message(
            "tensorflow.python.framework.convert_to_constants."
            "convert_variables_to_constants_v2") + r".*which TensorFlow \S+ does not provide "
                                                   r"as it did on TensorFlow 2\.21\.0"):
        _compat.freeze_concrete_function(function)


def test_silenced_tensorflow_deprecations_hides_deprecation_warnings(monkeypatch):
    import logging

    from tensorflow.python.util import deprecation

    def deprecated_function():
        @deprecation.deprecated(None, "Use something else.")
        def old():
            return 1

        return old

    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    try:
        with _compat.silenced_tensorflow_deprecations():
            assert deprecated_function()() == 1
        assert messages == []
        deprecated_function()()  # outside: TensorFlow says so
        assert len(messages) == 1 and "is deprecated" in messages[0]
    finally:
        logger.removeHandler(handler)
    monkeypatch.delattr(deprecation, "silence")  # as a release without it
    with pytest.raises(RuntimeError, match=_stale_message(
            "tensorflow.python.util.deprecation.silence()")):
        _compat.silenced_tensorflow_deprecations()


def test_tflite_converter_error_is_what_the_converter_raises(monkeypatch):
    import tensorflow as tf

    with pytest.raises(_compat.tflite_converter_error(), match="Erfinv"):
        _tflite_bytes(tf.math.erfinv, (2,))  # no TFLite built-in kernel
    from tensorflow.lite.python import convert_phase

    monkeypatch.delattr(convert_phase, "ConverterError")
    with pytest.raises(RuntimeError, match=_stale_message(
            "tensorflow.lite.python.convert_phase.ConverterError")):
        _compat.tflite_converter_error()


def test_tflite_schema_reads_and_writes_a_tflite_flatbuffer(monkeypatch):
    import sys


    schema = _compat.tflite_schema()
    content = _tflite_bytes(lambda x: x * 2.0 + 1.0, (1, 3))
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(content, 0))
    assert len(model.subgraphs) == 1 and len(model.subgraphs[0].operators) == 2
    assert isinstance(model.buffers[0], schema.BufferT)
    if _has_litert():  # LiteRT's copy first
        import ai_edge_litert

        assert schema.__name__ == "ai_edge_litert.schema_py_generated"
        monkeypatch.delattr(ai_edge_litert, "schema_py_generated", raising=False)
        monkeypatch.setitem(sys.modules, "ai_edge_litert.schema_py_generated", None)
    assert _compat.tflite_schema().__name__ == "tensorflow.lite.python.schema_py_generated"
    from tensorflow.lite import python as tflite_python

    monkeypatch.delattr(tflite_python, "schema_py_generated", raising=False)
    monkeypatch.setitem(sys.modules, "tensorflow.lite.python.schema_py_generated", None)
    with pytest.raises(ImportError, match=r"^Writing TFLite metadata needs the TFLite schema "
                                          r"module of TensorFlow or of ai-edge-litert"):
        _compat.tflite_schema()


def _has_litert():
    import importlib.util

    return importlib.util.find_spec("ai_edge_litert") is not None
