"""Quiet TensorFlow for the `keras-vit` command, and its one-line errors.

TensorFlow's C++ runtime writes straight to file descriptor 2: absl's
"All log messages before absl::InitializeLog()" banner, `I0000`/`E0000`
lines (CUDA stubs, `cuInit`, CPU feature guard) and the TFLite converter's
MLIR debug lines. `TF_CPP_MIN_LOG_LEVEL` silences only part of them, so
every command runs under `filtered_stderr()`, which drops those lines and
passes everything else through as it is written. `--verbose` turns all of it off.

Nothing here imports TensorFlow at module load.
"""

import contextlib
import json
import logging
import os
import sys
import threading
import warnings

from keras_vit._checks import finite_or_none
from keras_vit._framework_text import is_native_log_line, op_error_sentence

PROG = "keras-vit"
_state = {"verbose": False}

def quiet(verbose=False):
    """Silences the logging a command-line user cannot act on; call before
    TensorFlow is imported. With `verbose=True` it only records the choice."""
    _state["verbose"] = bool(verbose)
    # The command owns the process: keras_vit's lines go through its own
    # handler only. absl installs a root handler the first time TensorFlow
    # logs (tf.saved_model.save does), and every line then came twice
    # ("keras_vit: ..." and "WARNING:keras_vit:...").
    own = logging.getLogger("keras_vit")
    if own.handlers:
        own.propagate = False
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("ABSL_MIN_LOG_LEVEL", "3")
    # Keras/TensorFlow Python warnings about their own internals.
    for module in (r"keras(\..*)?", r"tensorflow(\..*)?", r"tf_keras(\..*)?",
                   r"absl(\..*)?", r"ai_edge_litert(\..*)?"):
        warnings.filterwarnings("ignore", module=module)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)
    if "absl.logging" in sys.modules:
        _quiet_absl()


def _quiet_absl():
    try:
        from absl import logging as absl_logging
    except ImportError:  # pragma: no cover - absl ships with TensorFlow
        return
    absl_logging.set_verbosity(absl_logging.ERROR)
    absl_logging.set_stderrthreshold("error")


@contextlib.contextmanager
def filtered_stderr():
    """Drops TensorFlow's native log lines written to fd 2 in the block;
    every other line written to stderr (Python's included) passes through
    as it is written (a thread reads a pipe standing in for fd 2)."""
    if _state["verbose"]:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real fd 2 (embedded)
        yield
        return
    read_end, write_end = os.pipe()

    def forward():
        pending = b""
        while True:
            chunk = os.read(read_end, 65536)
            *lines, pending = (pending + chunk).split(b"\n")
            if not chunk and pending:  # EOF: the last line had no newline
                lines.append(pending)
            data = b"".join(line + b"\n" for line in lines
                            if not is_native_log_line(line.decode("utf-8", "replace")))
            while data:
                data = data[os.write(saved, data):]
            if not chunk:
                break
        os.close(read_end)

    thread = threading.Thread(target=forward, name="keras-vit-stderr", daemon=True)
    thread.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the thread sees EOF
        thread.join(timeout=10)
        os.close(saved)


def load_tensorflow():
    """Imports TensorFlow and Keras and queries the devices with their
    native start-up lines filtered out; returns the `tensorflow` module."""
    # (No device query here: a multi-worker strategy must come first. The
    # cuInit line of the first device use is dropped by the filter `main`
    # runs every command under.)
    with filtered_stderr():
        import tensorflow as tf

        try:
            import keras  # noqa: F401  (its backend loads more native libraries)
        except ModuleNotFoundError as error:
            _missing_backend(error)
            raise
    if not _state["verbose"]:
        _quiet_absl()
        tf.get_logger().setLevel(logging.ERROR)
        with contextlib.suppress(Exception):
            tf.autograph.set_verbosity(0)
    return tf


_BACKEND_PACKAGES = {"torch": "torch (its CPU build: pip install torch --index-url "
                             "https://download.pytorch.org/whl/cpu)",
                     "jax": "jax (pip install 'keras-vision-transformer[jax]')"}


def _missing_backend(error):
    """KERAS_BACKEND names a backend whose package is not installed: one
    sentence (`ValueError`) instead of Keras' "No module named ..."."""
    backend = os.environ.get("KERAS_BACKEND", "")
    if backend in _BACKEND_PACKAGES and (error.name or "").split(".")[0] == backend:
        raise ValueError(
            f"KERAS_BACKEND={backend} but {backend} is not installed; install "
            f"{_BACKEND_PACKAGES[backend]}, or unset KERAS_BACKEND (TensorFlow)."
        ) from None


def progress_verbosity(verbose, stream=None):
    """Keras' `verbose` for `fit` by the `keras-vit` command's rule: the live
    progress bar (1) stays on a terminal and in a notebook (IPython's
    kernel draws it); written to a file or a pipe it becomes one line per
    epoch (2), since Keras' bar there is a heap of carriage returns and
    ANSI escapes. `stream`: where the progress goes (default: `sys.stdout`
    of the moment). 0 and 2 are kept.

    >>> import io
    >>> progress_verbosity(1, io.StringIO()), progress_verbosity(0, io.StringIO())
    (2, 0)
    """
    if verbose != 1 or "ipykernel" in sys.modules:
        return verbose
    stream = sys.stdout if stream is None else stream
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        terminal = False
    return 1 if terminal else 2


def plural(count, noun, nouns=None):
    """`"1 epoch"`, `"2 epochs"`, `"1,437 images"`: a count and its noun,
    pluralised (`nouns`: the plural where it is not noun + "s")."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


def json_dumps(obj):
    """Strict JSON (NaN and infinities written as null): what every
    `--json` line prints, so strict parsers can read a diverged run's."""
    return json.dumps(finite_or_none(obj), allow_nan=False)


# ----------------------------------------------------------------- errors

# Optional dependency (import name) -> (pip package, extra of this project).
DISTRIBUTION = "keras-vision-transformer"
OPTIONAL = {
    "matplotlib": ("matplotlib", "plots"),
    "tensorflow_datasets": ("tensorflow-datasets", "tfds"),
    "ai_edge_litert": ("ai-edge-litert", "export"),
    "tensorboard": ("tensorboard", "train"),
    "sklearn": ("scikit-learn", "train"),
    "PIL": ("pillow", "train"),
    "jax": ("jax[cpu]", "jax"),
    "h5py": ("h5py", None),
}


def install_hint(module):
    """`pip install ...` for an optional dependency's import name, or None."""
    top = (module or "").split(".")[0]
    if top not in OPTIONAL:
        return None
    package, extra = OPTIONAL[top]
    hint = f"pip install {package}"
    if extra:
        hint += f' (or pip install "{DISTRIBUTION}[{extra}]")'
    return hint


def _one_line(text):
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return " ".join(lines) if len(lines) <= 3 else lines[0]


def _op_error_message(error):
    message = getattr(error, "message", None) or str(error)
    return op_error_sentence(message) or type(error).__name__


def _is_op_error(error):
    tf = sys.modules.get("tensorflow")
    errors = getattr(tf, "errors", None)
    op_error = getattr(errors, "OpError", None)
    return op_error is not None and isinstance(error, op_error)


def _converted_data_error(error):
    """`keras_vit.data.data_error(error)` where it exists (it turns a
    pipeline error about a corrupt file into a ValueError), else None.
    Looked up among the loaded modules, not imported: a command that never
    loaded the data pipeline has no pipeline error to convert (and this
    module sits below `keras_vit.data`)."""
    data_error = getattr(sys.modules.get("keras_vit.data"), "data_error", None)
    if data_error is None:
        return None
    try:
        return data_error(error)
    except Exception:  # noqa: BLE001 - a failing converter must not hide the error
        return None


def error_message(error):
    """(message, exit status) of an exception escaping a command, or None
    for an exception that is a bug (shown with its traceback)."""
    # our own ValueErrors already name the file; convert TensorFlow's only
    converted = (None if isinstance(error, (ValueError, TypeError))
                 else _converted_data_error(error))
    if converted is not None:
        return _one_line(converted), 2
    if isinstance(error, ImportError):
        hint = install_hint(getattr(error, "name", None))
        message = _one_line(error)
        if hint and "pip install" not in message:
            message = f"{message.rstrip('.')}: {hint}"
        return message, 2
    if isinstance(error, OSError) and error.filename and error.strerror:
        return f"{error.strerror}: {error.filename!r}.", 2
    if isinstance(error, (ValueError, TypeError, OSError)):
        return _one_line(error), 2
    if _is_op_error(error):
        return _op_error_message(error), 2
    return None


class _Tracked:
    """A text stream that notes whether its last write ended a line (a
    Keras progress bar does not: it redraws its line after "\r")."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        if text:
            _state["mid_line"] = not text.endswith("\n")
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def line_tracking():
    """`sys.stdout` and `sys.stderr` note, for the block, whether the last
    text written to either left its line open, so that `print_error`
    starts on a fresh line instead of after a progress bar."""
    saved = sys.stdout, sys.stderr
    _state["mid_line"] = False
    sys.stdout, sys.stderr = _Tracked(sys.stdout), _Tracked(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def print_error(message, file=None):
    """`keras-vit: error: MESSAGE` on stderr, on a line of its own (after a
    line break when a progress bar left its line open)."""
    fresh = "\n" if _state.get("mid_line") else ""
    print(f"{fresh}{PROG}: error: {message}", file=file or sys.stderr)
