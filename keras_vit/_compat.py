"""Every use of a private Keras, TensorFlow or LiteRT API, in one place.

keras_vit otherwise uses public API only. Each hook below names the versions
it was checked on and has a test in `tests/test_compat.py` that fails loudly
when the assumption it rests on stops holding (a renamed attribute, a moved
module): never a silent fallback. When a framework release breaks one, this
file and that test are the only places to look.

Checked on: Keras 3.13-3.15, TensorFlow 2.20-2.21, ai-edge-litert 2.x.
What a framework says only in words (an error's text) is read in its
neighbour, `_framework_text.py`, under the same rule.
"""

import contextlib
import importlib

from keras_vit import _atomic

_ABSENT = object()

# Keras, TensorFlow and LiteRT are imported inside each hook: this module sits
# at the bottom of the package, under modules that `keras-vit --help` loads.


def _stale(what, framework, checked_on):
    """The one sentence a hook raises when its assumption no longer holds."""
    return RuntimeError(f"keras_vit relies on {what}, which {framework} does not provide as "
                        f"it did on {checked_on}: keras_vit/_compat.py needs updating for this "
                        "release.")


def _keras_release():
    import keras  # heavy: imports the backend

    return f"Keras {keras.__version__}"


def _tensorflow_release():
    import tensorflow as tf  # heavy

    return f"TensorFlow {tf.__version__}"


def _litert_release():
    import ai_edge_litert  # optional: the [export] extra

    return f"ai-edge-litert {getattr(ai_edge_litert, '__version__', '(version unknown)')}"


def _private(module, attribute, release, checked_on, what=None, valid=callable):
    """`module.attribute` from a private framework module, or the `_stale`
    sentence (naming `what`, default the dotted name) when the module is
    gone or the attribute is missing or fails `valid`."""
    try:
        value = getattr(importlib.import_module(module), attribute, None)
    except ImportError:
        value = None
    if value is None or not valid(value):
        raise _stale(what or f"{module}.{attribute}", release(), checked_on)
    return value


# --- saving, training and layers ---------------------------------------------


@contextlib.contextmanager
def swapped_variable_values(pairs):
    """Within this context each `keras.Variable` of `pairs`
    (`[(variable, value), ...]`) reads as `value` (a backend array of the
    same shape and dtype), without `assign`: on JAX `assign` lays a value
    back out over the variable's devices, and the point is to hold the
    gathered whole. The original values are back on exit.

    Sets `Variable._value` (private: the backend value that `.value`,
    `numpy()` and saving read). Checked on Keras 3.15.1 (TensorFlow 2.21.0,
    JAX backend).

    >>> with swapped_variable_values([(dense.kernel, whole_kernel)]):  # a fragment
    ...     model.save_weights("backup.weights.h5")  # doctest: +SKIP
    """
    pairs = list(pairs)
    for variable, _ in pairs:
        if getattr(variable, "_value", _ABSENT) is _ABSENT:
            raise _stale("Variable._value (the backend value a Keras variable reads)",
                         _keras_release(), "Keras 3.15.1")
    originals = [(variable, variable._value) for variable, _ in pairs]
    try:
        for variable, value in pairs:
            variable._value = value
        yield
    finally:
        for variable, original in originals:
            variable._value = original


def in_multi_worker_mode(strategy):
    """True when a `tf.distribute` strategy spans several worker processes
    (a `MultiWorkerMirroredStrategy` over a `TF_CONFIG` cluster of two or
    more workers); False for every one-process strategy.

    Calls `strategy.extended._in_multi_worker_mode()` (private: TensorFlow
    asks nothing else publicly). Checked on TensorFlow 2.21.0.

    >>> import tensorflow as tf
    >>> in_multi_worker_mode(tf.distribute.get_strategy())
    False
    """
    method = getattr(strategy.extended, "_in_multi_worker_mode", None)
    if not callable(method):
        raise _stale("StrategyExtended._in_multi_worker_mode() (does a tf.distribute "
                     "strategy span several workers)", _tensorflow_release(),
                     "TensorFlow 2.21.0")
    return method()


def build_from_first_replica(model, strategy):
    """Makes `model.fit`/`evaluate` build `model` from the first local
    replica's part of the first batch (only shapes and dtypes are read)
    instead of Keras' all-reduce of the whole batch structure, which fails
    under a multi-worker `tf.distribute` strategy (a tuple of `PerReplica`
    cannot be converted to a tensor; keras-team/keras#20585). Only this
    model instance changes. Returns `model`.

    Replaces the model's `_maybe_symbolic_build(iterator=None,
    data_batch=None)` (private: Keras' TensorFlow trainer calls it at the
    start of `fit`, `evaluate` and `predict`; its `iterator` yields
    `(_, _, iterator)` triples) with one that calls `_symbolic_build(
    data_batch=...)` (private) in the strategy's scope. Checked on Keras
    3.15.1 (TensorFlow 2.21.0).

    >>> strategy = tf.distribute.MultiWorkerMirroredStrategy()  # several workers  # doctest: +SKIP
    >>> build_from_first_replica(model, strategy)  # doctest: +SKIP
    """
    for name in ("_maybe_symbolic_build", "_symbolic_build"):
        if not callable(getattr(model, name, None)):
            raise _stale(f"Model.{name} (how Keras' TensorFlow trainer builds a model from "
                         "its first batch)", _keras_release(), "Keras 3.15.1")
    import tensorflow as tf  # heavy

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, it in iterator:
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0], next(it))
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = maybe_symbolic_build
    return model


def build_before_fit(model, element_spec):
    """Builds `model` (compiled) for `fit`: its layers, compiled loss and
    metrics and its optimizer's variables, from `element_spec` (a tf.data
    dataset's `(x, y)` spec; only shapes and dtypes are read), as Keras'
    TensorFlow trainer itself does at the start of `fit` when the model was
    made under a `tf.distribute` strategy. Returns `model`.

    Without a strategy, Keras builds them inside the first trace of the
    train step instead; variables created there make `tf.function` trace
    the whole step a second time (seconds for a small ViT, more for a large
    one, at the start of every `fit`). Call it in the scope the model was
    compiled in. Calls `Trainer._symbolic_build(data_batch=...)` (private).
    Checked on Keras 3.15.1 (TensorFlow 2.21.0).

    >>> build_before_fit(model, dataset.element_spec)  # a fragment  # doctest: +SKIP
    """
    method = getattr(model, "_symbolic_build", None)
    if not callable(method):
        raise _stale("Trainer._symbolic_build (how Keras builds a model, its compiled loss and "
                     "metrics and its optimizer before fit)", _keras_release(), "Keras 3.15.1")
    method(data_batch=element_spec)
    return model


def compute_loss(model, x, y, y_pred, sample_weight, training=True):
    """`model`'s loss as Keras' own `train_step` computes it: through
    `compute_loss`, passing `training` only to an override that takes it.

    Calls `Trainer._compute_loss` (private: the wrapper Keras' train steps
    use). Checked on Keras 3.15.1 (TensorFlow 2.21.0).

    >>> loss = compute_loss(  # a fragment of a train step
    ...     model, x, y, model(x, training=True), None)  # doctest: +SKIP
    """
    method = getattr(model, "_compute_loss", None)
    if not callable(method):
        raise _stale("Trainer._compute_loss (the loss Keras' train steps compute)",
                     _keras_release(), "Keras 3.15.1")
    return method(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)


def _unscale_loss_for_distribution():
    return _private("keras.src.losses.loss", "unscale_loss_for_distribution",
                    _keras_release, "Keras 3.15.1")


def update_loss_tracker(model, loss, batch_size):
    """Adds `loss` (this replica's loss of one batch of `batch_size`
    samples) to the "loss" that `fit` logs for a compiled `model`, as
    Keras' TensorFlow `train_step` does: unscaled from the replica's share
    under a `tf.distribute` strategy, weighted by the batch size. Before
    `compile` there is nothing to add to.

    Reads `Trainer._loss_tracker` (private: the `Mean` metric behind the
    logged "loss") and calls `keras.src.losses.loss.
    unscale_loss_for_distribution` (a private module). Checked on Keras
    3.15.1 (TensorFlow 2.21.0).

    >>> update_loss_tracker(model, loss, tf.shape(x)[0])  # a fragment  # doctest: +SKIP
    """
    tracker = getattr(model, "_loss_tracker", _ABSENT)
    if tracker is _ABSENT:
        raise _stale("Trainer._loss_tracker (the metric behind the loss fit logs)",
                     _keras_release(), "Keras 3.15.1")
    if tracker is not None:
        tracker.update_state(_unscale_loss_for_distribution()(loss), sample_weight=batch_size)


def update_metrics_variables(model, metrics_variables, unscaled_loss, x, y, y_pred,
                             sample_weight):
    """JAX: `(logs, metrics_variables)` after one batch, the loss tracker
    and the compiled metrics updated statelessly as Keras' own JAX
    `train_step` does.

    Calls `JAXTrainer._update_metrics_variables` (private). Checked on
    Keras 3.15.1 (JAX backend).

    >>> logs, metrics_variables = update_metrics_variables(  # a fragment  # doctest: +SKIP
    ...     model, metrics_variables, loss, x, y, y_pred, None)
    """
    method = getattr(model, "_update_metrics_variables", None)
    if not callable(method):
        raise _stale("JAXTrainer._update_metrics_variables (the metric update of a JAX "
                     "train step)", _keras_release(), "Keras 3.15.1")
    return method(metrics_variables, unscaled_loss, x, y, y_pred, sample_weight)


def optimizer_learning_rate(optimizer):
    """What a Keras optimizer was given as its learning rate: the
    `LearningRateSchedule` itself (`optimizer.learning_rate` is only its
    current value), or the variable holding a constant rate.

    Reads `Optimizer._learning_rate` (private). Checked on Keras 3.15.1.

    >>> import keras
    >>> schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.5)
    >>> optimizer_learning_rate(keras.optimizers.SGD(schedule)) is schedule
    True
    """
    rate = getattr(optimizer, "_learning_rate", _ABSENT)
    if rate is _ABSENT:
        raise _stale("Optimizer._learning_rate (the schedule an optimizer was given)",
                     _keras_release(), "Keras 3.15.1")
    return rate


def optimizer_variable_index(optimizer, variable):
    """The position of `variable` among the variables `optimizer` was built
    with (`optimizer.variables` of each slot are in that order), for the
    variable an `update_step` receives: a Keras variable, or on TensorFlow
    the `tf.Variable` under it (also a replica's, under a strategy).

    Calls `Optimizer._get_variable_index` (private: how Keras' own
    `update_step`s find a variable's slots). Checked on Keras 3.15.1.

    >>> import keras
    >>> model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
    >>> optimizer = keras.optimizers.SGD(momentum=0.9)
    >>> optimizer.build(model.trainable_variables)
    >>> optimizer_variable_index(optimizer, model.trainable_variables[1])  # the bias
    1
    """
    method = getattr(optimizer, "_get_variable_index", None)
    if not callable(method):
        raise _stale("Optimizer._get_variable_index (a variable's position in an "
                     "optimizer)", _keras_release(), "Keras 3.15.1")
    return method(variable)


class AroundBackupSave:
    """Mixin for a `keras.callbacks.BackupAndRestore` subclass (listed
    first among the bases): each backup is written inside the context
    manager `self.saving_context()` returns (override it; the default does
    nothing).

    Wraps `BackupAndRestore._save_model()` (private: the method whose call
    writes one backup, from `on_epoch_end` or `on_train_batch_end`).
    Checked on Keras 3.15.1; the class refuses to construct when its base
    has no `_save_model`.

    >>> import keras
    >>> class Backup(AroundBackupSave, keras.callbacks.BackupAndRestore):
    ...     def saving_context(self):
    ...         return gathered(self.model)
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not callable(getattr(super(), "_save_model", None)):
            raise _stale("BackupAndRestore._save_model() (what writes one backup)",
                         _keras_release(), "Keras 3.15.1")

    def saving_context(self):
        return contextlib.nullcontext()

    def _save_model(self):
        """Keras writes `latest.weights.h5` and `training_metadata.json` in
        place: a kill while it writes left a half file that a resume must
        refuse. Here both go to temporaries beside them (through Keras'
        private `_weights_path` and `_training_metadata_path`) and are
        renamed into place after the context: the weights, then the epoch
        that names them."""
        final = {"_weights_path": self._weights_path,
                 "_training_metadata_path": self._training_metadata_path}
        if not all(isinstance(getattr(self, name, None), str) for name in final):
            raise _stale("BackupAndRestore._weights_path and _training_metadata_path (where "
                         "one backup is written)", _keras_release(), "Keras 3.15.1")
        # (Keras' save_weights wants a name that ends in .weights.h5; the inner
        # block's rename, the weights', comes first)
        with _atomic.renamed_into_place(final["_training_metadata_path"]) as metadata, \
                _atomic.renamed_into_place(final["_weights_path"], ".weights.h5") as weights:
            try:
                self._weights_path, self._training_metadata_path = weights, metadata
                with self.saving_context():
                    super()._save_model()
            finally:
                for name, path in final.items():
                    setattr(self, name, path)


def in_xla_context():
    """True while TensorFlow traces the current graph (or a graph it is
    nested in) for XLA: `tf.function(jit_compile=True)`, TPUs.

    Calls `tensorflow.python.ops.control_flow_util.
    GraphOrParentsInXlaContext` on `tf.compat.v1.get_default_graph()` (a
    private module: TensorFlow has no public question for it). Checked on
    TensorFlow 2.21.0.

    >>> import tensorflow as tf
    >>> in_xla_context()
    False
    >>> bool(tf.function(lambda: in_xla_context(), jit_compile=True, autograph=False)())
    True
    """
    import tensorflow as tf  # heavy

    check = _private("tensorflow.python.ops.control_flow_util", "GraphOrParentsInXlaContext",
                     _tensorflow_release, "TensorFlow 2.21.0")
    return check(tf.compat.v1.get_default_graph())


# --- export --------------------------------------------------------------------



def build_shapes(layer):
    """The shapes a Keras layer was built with, `{build argument: shape}`
    (e.g. `{"input_shape": (None, 224, 224, 3)}`), or None when it is not
    built from shapes yet. For a subclassed model this is the only record
    of its input shape (it has no `inputs`).

    Reads `Layer._build_shapes_dict` (private: set by the wrapper Keras puts
    around every `build`). Checked on Keras 3.15.1 (TensorFlow 2.21.0).

    >>> import keras
    >>> model = keras.Sequential([keras.layers.Dense(2)])
    >>> model.build((None, 5)); build_shapes(model)
    {'input_shape': (None, 5)}
    """
    try:
        shapes = layer._build_shapes_dict
    except AttributeError:
        raise _stale("Layer._build_shapes_dict (the shapes a layer was built with)",
                     _keras_release(), "Keras 3.15.1") from None
    if shapes is not None and not isinstance(shapes, dict):
        raise _stale("Layer._build_shapes_dict being a dict of shapes",
                     _keras_release(), "Keras 3.15.1")
    return shapes


def attach_to_export_archive(archive, name, trackable):
    """Makes `trackable` (e.g. a `tf.saved_model.Asset`) an attribute
    `name` of the object a `keras.export.ExportArchive` saves, so that
    `tf.saved_model.load(path).<name>` restores it.

    Sets it on `ExportArchive._tf_trackable` (private: the root object
    `write_out` passes to `tf.saved_model.save`). Checked on Keras 3.15.1
    (TensorFlow 2.21.0).

    >>> attach_to_export_archive(archive, "labels", asset)  # a fragment  # doctest: +SKIP
    >>> archive.write_out("served/1")  # doctest: +SKIP
    >>> tf.saved_model.load("served/1").labels.asset_path  # doctest: +SKIP
    """
    root = getattr(archive, "_tf_trackable", None)
    if root is None:
        raise _stale("ExportArchive._tf_trackable (the object a SavedModel export saves)",
                     _keras_release(), "Keras 3.15.1")
    setattr(root, name, trackable)


def tflite_op_names(interpreter):
    """The op name of each node of a LiteRT `Interpreter`'s graph, in node
    order (the graph as written: built-in ops by name, e.g.
    `"FULLY_CONNECTED"`, Flex ops as `"Flex<Op>"`, custom ones `"CUSTOM"`).

    Reads `Interpreter._get_ops_details()` (private: LiteRT has no public
    list of a model's ops). Checked on ai-edge-litert 2.3.0 (`python -c
    "import ai_edge_litert; print(ai_edge_litert.__version__)"`).

    >>> tflite_op_names(  # needs an exported file
    ...     Interpreter(model_path="vit.tflite"))[:2]  # doctest: +SKIP
    ['CONV_2D', 'RESHAPE']
    """
    details = getattr(interpreter, "_get_ops_details", None)
    if details is None:
        raise _stale("Interpreter._get_ops_details() (the list of a TFLite model's ops)",
                     _litert_release(), "ai-edge-litert 2.3.0")
    names = [op.get("op_name") if isinstance(op, dict) else None for op in details()]
    if not all(isinstance(name, str) for name in names):
        raise _stale("Interpreter._get_ops_details() giving each op as a dict with its "
                     "'op_name'", _litert_release(), "ai-edge-litert 2.3.0")
    return names


def freeze_concrete_function(function):
    """`function` (a `tf.function`'s `ConcreteFunction`) with its captured
    variables turned into constants, control flow kept as functional ops
    and nested calls inlined: a graph of constants that converters (tf2onnx)
    take as a `GraphDef`.

    Calls `tensorflow.python.framework.convert_to_constants.
    convert_variables_to_constants_v2(lower_control_flow=False,
    aggressive_inlining=True)` (a private module: TensorFlow has no public
    way to freeze a TF2 function). Checked on TensorFlow 2.21.0.

    >>> function = tf.function(f).get_concrete_function(spec)  # a fragment  # doctest: +SKIP
    >>> freeze_concrete_function(function).graph.as_graph_def()  # doctest: +SKIP
    """
    convert = _private("tensorflow.python.framework.convert_to_constants",
                       "convert_variables_to_constants_v2", _tensorflow_release,
                       "TensorFlow 2.21.0")
    return convert(function, lower_control_flow=False, aggressive_inlining=True)


def silenced_tensorflow_deprecations():
    """A context manager inside which TensorFlow logs no deprecation
    warnings (tf2onnx calls deprecated TensorFlow functions on every
    conversion).

    Returns `tensorflow.python.util.deprecation.silence()` (a private
    module). Checked on TensorFlow 2.21.0.

    >>> with silenced_tensorflow_deprecations():  # a fragment  # doctest: +SKIP
    ...     tf2onnx.convert.from_graph_def(graph_def, ...)
    """
    silence = _private("tensorflow.python.util.deprecation", "silence", _tensorflow_release,
                       "TensorFlow 2.21.0", what="tensorflow.python.util.deprecation.silence()")
    return silence()


def tflite_converter_error():
    """The exception class `tf.lite.TFLiteConverter.convert` raises when a
    model does not convert (its message names the ops without a built-in
    kernel). TensorFlow does not export it under `tf.lite`.

    Returns `tensorflow.lite.python.convert_phase.ConverterError` (a private
    module). Checked on TensorFlow 2.21.0.

    >>> try:  # a fragment (the caller's converter)  # doctest: +SKIP
    ...     converter.convert()
    ... except tflite_converter_error() as error:
    ...     print(error)
    """
    return _private("tensorflow.lite.python.convert_phase", "ConverterError",
                    _tensorflow_release, "TensorFlow 2.21.0",
                    what="tensorflow.lite.python.convert_phase.ConverterError (what the "
                         "TFLite converter raises)",
                    valid=lambda error: isinstance(error, type) and issubclass(error, Exception))


TFLITE_SCHEMA_MISSING = ("Writing TFLite metadata needs the TFLite schema module of "
                         "TensorFlow or of ai-edge-litert (pip install ai-edge-litert).")


def tflite_schema():
    """The TFLite model schema as generated flatbuffers Python (`Model`,
    the object API's `ModelT`, `BufferT`...): ai-edge-litert's
    `ai_edge_litert.schema_py_generated` when it is installed, else
    TensorFlow's copy of the same generated file,
    `tensorflow.lite.python.schema_py_generated` (a private module).
    Checked on ai-edge-litert 2.3.0 and TensorFlow 2.21.0.

    >>> schema = tflite_schema()
    >>> hasattr(schema, "ModelT")
    True
    >>> schema.ModelT.InitFromObj(  # content: a .tflite file's bytes
    ...     schema.Model.GetRootAsModel(content, 0))  # doctest: +SKIP
    """
    try:
        from ai_edge_litert import schema_py_generated as schema  # optional: [export]
        name, release, checked_on = "ai_edge_litert", _litert_release, "ai-edge-litert 2.3.0"
    except ImportError:
        try:
            from tensorflow.lite.python import schema_py_generated as schema  # heavy, private
            name, release, checked_on = "tensorflow.lite.python", _tensorflow_release, \
                "TensorFlow 2.21.0"
        except ImportError:
            raise ImportError(TFLITE_SCHEMA_MISSING) from None
    if not all(hasattr(schema, attr) for attr in ("Model", "ModelT", "BufferT")):
        raise _stale(f"{name}.schema_py_generated (the TFLite flatbuffer schema with its "
                     "object API)", release(), checked_on)
    return schema
