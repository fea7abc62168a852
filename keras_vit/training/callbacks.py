"""Fault tolerance and logs for `model.fit`."""

import contextlib
import hashlib
import json
import logging
import math
import os
import zipfile

import keras
import numpy as np

from keras_vit import _atomic, _compat
from keras_vit._console import plural
from keras_vit._saving import host_values, save_atomically, without_optimizer
from keras_vit.errors import CheckpointMismatchError, CorruptCheckpointError
from keras_vit.layers import lora
from keras_vit.layers.blocks import walk_layers
from keras_vit.training.run_folder import BACKUP_WEIGHTS, damaged, read_backup
from keras_vit.weights.keras_h5 import check_keras_weights
from keras_vit.weights.npz import read_npz_arrays

logger = logging.getLogger("keras_vit")


def _finite(value):
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


class TerminateOnNaNWithAdvice(keras.callbacks.Callback):
    """Stops training on a NaN/inf loss and says what to try. After `fit`,
    `stopped_at` is `(epoch from 0, batch from 1, loss)` of the first non-finite loss (or
    None): the model's weights are then not to be trusted."""

    def __init__(self):
        super().__init__()
        self.stopped_at = None
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not _finite(loss) and self.stopped_at is None:
            self.stopped_at = (self._epoch, batch + 1, float(loss))  # batch from 1
            self.model.stop_training = True
            logger.warning(
                "loss became %s at epoch %d, batch %d; training stopped. "
                "Try: a lower learning rate (--learning-rate), a longer warmup, "
                "gradient clipping (recipes clip the global norm at 1.0), "
                "--precision float32 instead of mixed_float16, and check the "
                "data for NaNs / labels out of range.", loss, self._epoch + 1, batch + 1)


class EpochLogger(keras.callbacks.CSVLogger):
    """`keras.callbacks.CSVLogger` with the epochs counted from 1, as
    `best.keras.json`, the results and the progress lines count them
    (Keras' own CSVLogger writes 0 for the first epoch)."""

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch + 1, logs)


class BestModelCheckpoint(keras.callbacks.Callback):
    """Saves `model` to `path` when `monitor` reaches its best value so far,
    over the whole run, resumed epochs included.

    Differs from `keras.callbacks.ModelCheckpoint(save_best_only=True)`,
    whose best value starts afresh each `fit` call (so the first epoch
    after a resume always overwrote the file, however worse):

    - the best value and its epoch are written beside the model
      (`<path>.json`, e.g. `best.keras.json`); when the run resumes from
      `backup_dir` (a `BackupAndRestore` backup), that value is the one to
      beat;
    - an epoch whose loss or monitored value is not finite never counts;
    - the model is written to a temporary file and renamed, so a kill never
      leaves a partial file under `path`;
    - a model with LoRA adapters is written merged (`merge_lora`).

    `model`: what to save (default: the model being fit; `train` gives the
    network inside a `SAMModel`).
    """

    def __init__(self, path, monitor="val_accuracy", mode="max", backup_dir=None,
                 model=None):
        super().__init__()
        if mode not in ("max", "min"):
            raise ValueError(f"mode={mode!r}; allowed: 'max', 'min'.")
        self.path, self.monitor, self.mode = str(path), monitor, mode
        self.state_path = self.path + ".json"
        self.backup_dir = backup_dir
        self._to_save = model
        self.best = None  # {"monitor", "value", "epoch"} (epoch counted from 1)
        self._warned = False

    def _better(self, value):
        if self.best is None:
            return True
        return value > self.best["value"] if self.mode == "max" else value < self.best["value"]

    def on_train_begin(self, logs=None):
        self.best = None
        if not self.backup_dir:
            return
        backup = read_backup(self.backup_dir, (self.params or {}).get("epochs"),
                             best=self.state_path)
        if backup.epoch and backup.best and backup.best["monitor"] == self.monitor:
            self.best = backup.best  # else a new run: its own first epoch sets the best

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        value = logs.get(self.monitor)
        if value is None:
            if not self._warned:
                logger.warning("%s is not in the logs (%s): %s is not written.",
                               self.monitor, sorted(logs), self.path)
                self._warned = True
            return
        if not (_finite(value) and _finite(logs.get("loss", 0.0))) or not self._better(value):
            return
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        # The model alone, without the optimizer's state (the backup keeps it);
        # a model with LoRA adapters merged.
        save_atomically(without_optimizer(lora.merge_lora(self._to_save or self.model)),
                        self.path)
        self.best = {"monitor": self.monitor, "value": float(value), "epoch": epoch + 1}
        _atomic.write_text(self.state_path, json.dumps(self.best))


class BackupAndRestore(_compat.AroundBackupSave, keras.callbacks.BackupAndRestore):
    """Keras' `BackupAndRestore`, whose backup every process of a
    multi-process JAX job can write, also when the model's variables are
    split over several processes' devices (`_saving.host_values`).

    A model with LoRA adapters (`keras_vit.layers.lora.enable_lora`) is
    backed up exactly: Keras' weights file would hold each adapted kernel
    merged (`W + delta`) and no adapters, and a resumed run would go on
    from zeroed adapters, which never train again (both factors zero: no
    gradient). Here the file holds the frozen `W`, and the adapters go to
    `lora_adapters.npz` beside it, with the backup's epoch."""

    ADAPTERS = "lora_adapters.npz"
    RANDOM_STATE = "random_state.npz"

    @contextlib.contextmanager
    def saving_context(self):
        with host_values(self.model), lora.base_kernels_saved(self.model):
            yield
        states = _random_states(self.model)
        if states:  # dropout's and drop-path's: the masks after a resume are the same
            with _atomic.replacing(os.path.join(self.backup_dir, self.RANDOM_STATE),
                                   "wb") as f:
                np.savez(f, __epoch__=np.int64(self._current_epoch), **{
                    str(i): keras.ops.convert_to_numpy(v.value) for i, v in enumerate(states)})
        adapters = lora.adapter_values(self.model)
        if adapters:  # after Keras' files: the epoch they record
            with _atomic.replacing(os.path.join(self.backup_dir, self.ADAPTERS), "wb") as f:
                np.savez(f, **{"__epoch__": np.int64(self._current_epoch), **adapters})

    def on_train_begin(self, logs=None):
        """Checks the backup (`run_folder.read_backup`) and that its weights
        fit the model before Keras restores them: a damaged backup is one
        ValueError naming its file, never a run resumed from the wrong
        weights or epoch."""
        epoch = read_backup(self.backup_dir, (self.params or {}).get("epochs")).epoch
        if epoch:
            _check_backup_weights(self.model, os.path.join(self.backup_dir, BACKUP_WEIGHTS))
        super().on_train_begin(logs)
        if epoch and lora.lora_layers(self.model):
            self._restore_adapters(epoch)
        if epoch:
            self._restore_random_states(epoch)
            if keras.backend.backend() == "torch" and _dropout_layers(self.model):
                logger.warning(
                    "Resuming on the torch backend: the dropout masks after the resume differ "
                    "from the run never killed (Keras' dropout draws there from PyTorch's "
                    "global generator, which no backup holds), so the final weights differ "
                    "slightly; on TensorFlow a resumed run repeats it exactly.")

    def _restore_adapters(self, epoch):
        path = os.path.join(self.backup_dir, self.ADAPTERS)
        saved = {}
        if os.path.exists(path):
            _check_member_sizes(path, lora.adapter_values(self.model))
            try:  # each .npy header checked against the zip's sizes first
                saved = read_npz_arrays(path, path)
            except CorruptCheckpointError as error:
                raise ValueError(
                    f"{str(error).rstrip('.')}: not a LoRA backup keras_vit wrote; start the "
                    "run afresh (--overwrite).") from error
        if int(saved.pop("__epoch__", -1)) != epoch:
            raise ValueError(
                f"The backup in {self.backup_dir} holds epoch {epoch} but no LoRA adapters "
                "of that epoch (the run was stopped while writing it); start the run "
                "afresh (--overwrite).")
        lora.set_adapter_values(self.model, saved)


    def _restore_random_states(self, epoch):
        """The random layers' seed states of the backup's epoch (Keras'
        weights file leaves them out), so that a resumed run draws the
        dropout and drop-path masks the run never killed draws."""
        states = _random_states(self.model)
        path = os.path.join(self.backup_dir, self.RANDOM_STATE)
        if not states:
            return
        if not os.path.exists(path):  # a backup of an earlier keras_vit
            logger.warning("%s holds no random state (dropout, drop-path): the resumed run "
                           "draws other masks than the run never killed.", self.backup_dir)
            return
        own = {str(i): keras.ops.convert_to_numpy(v.value) for i, v in enumerate(states)}
        try:
            _check_member_sizes(path, own, what=("random-state backup", "state"))
            saved = read_npz_arrays(path, path)
        except (CorruptCheckpointError, zipfile.BadZipFile, OSError) as error:
            damaged(path, f"cannot be read as the backup's random state ({error})")
        if (int(saved.pop("__epoch__", -1)) != epoch or set(saved) != set(own)
                or any(saved[k].shape != own[k].shape for k in own)):
            damaged(path, f"is not the random state of this model at epoch {epoch}")
        for i, variable in enumerate(states):
            variable.assign(saved[str(i)].astype(own[str(i)].dtype))


def _dropout_layers(model):
    """The layers of `model` (nested models included) that apply dropout:
    Dropout layers and encoder blocks with a dropout rate."""
    return [layer for layer in walk_layers(model)
            if isinstance(layer, keras.layers.Dropout) and layer.rate > 0
            or getattr(layer, "dropout_rate", 0) or getattr(layer, "attention_dropout_rate", 0)]


def _random_states(model):
    """The variables of `model` that are not weights: the states of its
    random layers' `keras.random.SeedGenerator`s (dropout, drop-path)."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def _check_backup_weights(model, path):
    """A `run_folder.DamagedRunError` naming `path` unless it is a Keras weights file
    holding exactly the arrays `model` saves (`check_keras_weights`)."""
    try:
        check_keras_weights(model, path)
    except CheckpointMismatchError as error:
        parts = [f"{len(x)} {what}" for x, what in (
            (error.unexpected, "arrays the model does not have"),
            (error.missing, "arrays of the model missing"),
            (error.misshaped, "arrays of another shape")) if x]
        damaged(path, f"does not fit the model of this run ({', '.join(parts)}: another "
                      "model wrote it)")
    except OSError as error:  # h5py: truncated, not HDF5
        damaged(path, f"cannot be read as Keras weights ({error})")


def _check_member_sizes(path, adapters, header=4096, what=("LoRA backup", "adapter")):
    """A ValueError before reading `path` (an `.npz`) when one of its arrays
    would decompress to more than the adapter of its name (plus a header):
    what a backup holds is bounded by the model, whatever the file says."""
    limits = {f"{name}.npy": value.nbytes + header for name, value in adapters.items()}
    limits["__epoch__.npy"] = header
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.file_size > limits.get(info.filename, 0):
                raise ValueError(
                    f"{path} is not a {what[0]} of this model: its member "
                    f"{info.filename!r} holds {info.file_size:,} bytes, more than the model's "
                    f"{what[1]} of that name; start the run afresh (--overwrite).")


class WeightsMoved(keras.callbacks.Callback):
    """Whether `fit` changed any trainable weight: `changed` is True or
    False after training (None before). Compares a SHA-256 of each
    trainable variable's bytes at the start of training (after
    `BackupAndRestore` restored them: place it after that callback) and
    at the end, so nothing is copied."""

    def __init__(self):
        super().__init__()
        self.changed = None
        self._before = None

    def _digests(self):
        with host_values(self.model):
            return [hashlib.sha256(np.ascontiguousarray(
                keras.ops.convert_to_numpy(v.value)).tobytes()).digest()
                for v in self.model.trainable_variables]

    def on_train_begin(self, logs=None):
        self._before = self._digests()

    def on_train_end(self, logs=None):
        self.changed = self._digests() != self._before


def unmoved_message(optimizer, updates, model):
    """Why a run changed no weight, in one sentence."""
    if not model.trainable_variables:
        return ("Training changed no weight: the model has no trainable weights (every "
                "layer is frozen); model.keras was not written.")
    schedule = optimizer.learning_rate_schedule if hasattr(
        optimizer, "learning_rate_schedule") else None
    schedule = _compat.optimizer_learning_rate(optimizer) if schedule is None else schedule
    try:  # the schedule at (up to 1,000 of) the run's updates
        every = getattr(schedule, "steps_per_update", 1)
        steps = np.unique(np.linspace(0, updates - 1, min(updates, 1000)).astype("int64"))
        peak = float(np.max(keras.ops.convert_to_numpy(schedule(steps * every))))
    except Exception:  # noqa: BLE001  (another schedule: its current value)
        peak = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    if peak == 0:
        why = f"the learning rate was 0 at every update ({plural(updates, 'update')})"
    else:
        why = (f"{plural(updates, 'optimizer update')} at a peak learning rate of {peak:g} "
               f"{'was' if updates == 1 else 'were'} too small to change any float32 weight")
    return (f"Training changed no weight: {why}; model.keras was not written. Give a "
            "larger --learning-rate, or more steps or epochs.")


def default_callbacks(out, monitor="val_accuracy", model=None, ema=False):
    """BackupAndRestore (resume after a kill), the best model over the whole
    run, CSV and TensorBoard logs, NaN guard. Files under `out`:
    `backup/`, `best.keras` (and `best.keras.json`: its epoch and value),
    `log.csv` (one row per epoch; its `epoch` column counts from 1, as
    `best.keras.json`), `tensorboard/`. `model`: what `best.keras` holds (default:
    the model being fit).

    `ema`: the optimizer keeps a moving average of the weights (`use_ema`):
    Keras' `SwapEMAWeights(swap_on_epoch=True)` after the backup (which
    keeps the training weights and the average) puts the average in the
    model for validation and for the callbacks after it (`best.keras`), and
    leaves it there after the last epoch (then `model.keras`)."""
    os.makedirs(out, exist_ok=True)
    backup = os.path.join(out, "backup")
    # The order of the files each epoch: log.csv's row, then the backup, then
    # best.keras (`run_folder.read_backup` checks a resumed folder by it).
    callbacks = [
        EpochLogger(os.path.join(out, "log.csv"), append=True),
        BackupAndRestore(backup),
        *([keras.callbacks.SwapEMAWeights(swap_on_epoch=True)] if ema else []),
        BestModelCheckpoint(os.path.join(out, "best.keras"), monitor=monitor,
                            backup_dir=backup, model=model),
        TerminateOnNaNWithAdvice(),
    ]
    try:
        import tensorboard  # noqa: F401  (tf.summary needs it)
    except ImportError:
        logger.info("TensorBoard logs off: pip install tensorboard "
                    "(or 'keras-vision-transformer[train]').")
    else:
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(out, "tensorboard"),
                                                     write_graph=False))
    return callbacks
