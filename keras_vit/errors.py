"""Every public error class of keras_vit. The checkpoint errors: what is
wrong with a weights file, one class per kind of problem, each a
`ValueError` (a bad `weights=` argument), and `WeightsDownloadError` (an
`OSError`: a file could not be downloaded); `MissingDependencyError` (an
optional package is missing), `TrainingDivergedError` (training stopped
on a NaN loss) and `ExportVerificationError` (an export missed its bar).

The bottom floor of the package (imports nothing of it, no NumPy, no Keras),
so that every module that reads or loads checkpoints raises the same
classes; `keras_vit.weights` and `keras_vit.weights.official` re-export
them.

>>> try:
...     raise CheckpointNotFoundError("missing.npz")
... except FileNotFoundError as error:
...     print(error)
Weights file not found: 'missing.npz'.
"""

import errno


class CheckpointMismatchError(ValueError):
    """The checkpoint's keys or shapes do not fit the model.

    Raised by `load_official_weights` with the full key lists as attributes
    `missing`, `unexpected` and `misshaped` (the message shows at most 20 of
    each), and `source` / `model_name`.
    """

    def __init__(self, message, missing=(), unexpected=(), misshaped=(),
                 source=None, model_name=None):
        super().__init__(message)
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.misshaped = list(misshaped)
        self.source = source
        self.model_name = model_name


class CorruptCheckpointError(ValueError):
    """The file is an official `.npz` (a zip of `.npy` arrays), an HDF5 or a
    safetensors file, but a damaged or lying one: bad zip, CRC error,
    truncated, pickled entries, an empty file, a header that does not fit
    the data, or more bytes than `max_checkpoint_bytes()`."""


class UnsupportedCheckpointError(ValueError):
    """The file is readable but in a format keras_vit does not load (a
    PyTorch or safetensors checkpoint, a whole Keras model, a TensorFlow
    checkpoint, an HTML page, ...). The message names the format found."""


class NotAnNpzError(CorruptCheckpointError, UnsupportedCheckpointError):
    """A file named `.npz` whose bytes are another format (a server's error
    page saved under the checkpoint's name, a `.npy` or `.h5` renamed): both
    corrupt (a cached download is deleted and fetched again) and
    unsupported (the message names the format found)."""


class CheckpointNotFoundError(ValueError, FileNotFoundError):
    """No file at the given path ("Weights file not found: 'PATH'.").

    Both a `ValueError` (a bad `weights=` argument) and a
    `FileNotFoundError` (`errno` is ENOENT); `path` is the path as given.
    """

    def __init__(self, path):
        self.path = path
        message = f"Weights file not found: {path!r}."
        super().__init__(message)
        self.errno, self.strerror = errno.ENOENT, message

    def __str__(self):  # OSError's "[Errno 2] ..." form would hide the message
        return self.strerror

    def __reduce__(self):
        return type(self), (self.path,)


class WeightsDownloadError(OSError):
    """A file could not be downloaded (offline, HTTP error, stalled or
    broken connection, bad mirror)."""


class TrainingDivergedError(RuntimeError):
    """`train` stopped on a NaN/inf loss. `results` is the run's results
    dict (`"status": "diverged"`, metrics None, `"model": None`); the
    weights were not saved as `model.keras`; `best.keras`, when written,
    holds the best epoch before the divergence."""

    def __init__(self, message, results):
        super().__init__(message)
        self.results = results


class ExportVerificationError(ValueError):
    """An export is further from the Keras model than its mode allows.

    `report` holds the measured figures; the rejected file is kept next to
    the requested path with a `.rejected` suffix for inspection, its report
    beside it as `<path>.rejected.json`. Nothing is left at the requested
    path."""

    def __init__(self, message, report):
        super().__init__(message)
        self.report = report


class MissingDependencyError(ImportError):
    """`hf://` weights need huggingface_hub (the `hf` extra)."""
