"""Fixtures and helpers shared by the test files.

Helpers (plain functions; import them: `from conftest import tiny_vit, run_cli`):

- `tiny_vit(**overrides)`, `tiny_mixer(**overrides)`: the tiny models the
  tests build (a few thousand parameters; 32x32 images, 3 classes unless
  overridden), and `tiny_keras_file(path, **overrides)`: one saved as `.keras`.
- `random_weights(model, scale=0.2)`: every weight redrawn, seeded (logits far
  from zero, as the export tests need).
- `predict(model, x)`: a model's outputs as NumPy.
- `run_cli(*argv)`: `keras-vit ARGV` in this process: `CliResult(code, out, err)`.
- `run_cli_process(*argv)`: `keras-vit ARGV` in a fresh process, for the tests
  where the process itself is what is tested (lazy imports, signals, several
  workers, another backend).

Fixtures: `digits_folder`, the quickstart's digits written once per session
(per xdist worker), and `few_digits_folder`, ten digits with 6 train and 3
test scans each. Read only: a test that changes files makes its own
folder (`data_helpers.write_digit_folder`, `make_folder`) in `tmp_path`.
"""

import atexit
import contextlib
import glob
import io
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from typing import NamedTuple

import numpy as np
import pytest


def _xla_for_tests():
    """How XLA compiles in the test run, set before Keras (and JAX) is
    imported: in the pytest process that starts the xdist workers (they
    inherit it) and so in every process a test starts (`process_env`).

    - `--xla_backend_optimization_level=0`: XLA's CPU backend skips LLVM's
      optimisation passes. The tests' tiny models take longer to compile
      than to run. The programs are the same; only their machine code is
      less optimised.
    - One persistent JAX compilation cache for the whole run, every
      compilation kept: tests that build the same tiny model compile the
      same programs, in whichever worker or process.

    `KERAS_BACKEND=jax python -m pytest -m backends` on 2 cores: 223 s
    without either, 188 s with the first, 158 s with both."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_backend_optimization_level" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_backend_optimization_level=0".strip()
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        _remove_caches_of_dead_runs()
        folder = tempfile.mkdtemp(prefix=f"{_JAX_CACHE_PREFIX}{os.getpid()}_")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"


_JAX_CACHE_PREFIX = "keras_vit_tests_jax_cache_"


def _remove_caches_of_dead_runs():
    """The caches of test runs that were killed (SIGKILL skips atexit): a
    folder whose pytest process, named in it, no longer runs (~20 MB each)."""
    if os.name != "posix":  # (os.kill(pid, 0) would end the process on Windows)
        return
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), f"{_JAX_CACHE_PREFIX}*_*")):
        pid = os.path.basename(folder)[len(_JAX_CACHE_PREFIX):].split("_")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # it runs (another user's)
            pass


def _threads_for_tests():
    """Under xdist, each worker runs an op on its share of the cores, read
    when each library starts (the processes a test starts inherit them):
    by default each of the two workers on 2 cores runs every op on 2
    threads, and they contend.

    - `TF_NUM_INTRAOP_THREADS`, TensorFlow's. `python -m pytest
      tests/test_trainer_edges.py tests/test_data_edges.py
      tests/test_run_folder.py tests/test_tf_records.py tests/test_lora.py`
      on 2 cores (Intel Xeon, 2026-11-27), twice each: 185 and 187 s with
      TensorFlow's default, 176 and 173 s with one thread per worker.
    - `OMP_NUM_THREADS`, PyTorch's (OpenMP's threads wait for work by
      spinning, so two workers' threads on two cores mostly wait for each
      other). `KERAS_BACKEND=torch python -m pytest -m backends` on 2 cores
      (AMD EPYC, 2026-11-27): 156 s with PyTorch's default, its quickstart
      test 102 s; 96 s with one thread per worker, the quickstart 52 s.

    (JAX's CPU threads made no difference: `-m backends` on JAX 191 s
    against 190.)"""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
        for variable in ("TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS"):
            os.environ.setdefault(variable, str(max(1, cores // workers)))


_xla_for_tests()
_threads_for_tests()


def xla_flags(*flags):
    """The test run's XLA_FLAGS (`_xla_for_tests`) with `flags` added, for
    a process that needs its own (a count of CPU devices)."""
    return " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()


import keras  # noqa: E402 - after _xla_for_tests
from official_fixtures import REPO_ROOT  # noqa: E402 - imports keras_vit

# The tiny ViT: 16 patches of 8x8 pixels, one block of width 16.
TINY_VIT = dict(patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                input_shape=(32, 32, 3), classes=3)
TINY_MIXER = dict(patch_size=8, hidden_size=16, num_blocks=1, tokens_mlp_dim=8,
                  channels_mlp_dim=32, input_shape=(32, 32, 3), classes=3)


def pytest_collection_modifyitems(items):
    """The tests marked `long` (a minute or more each) go first, in their
    order; the rest keep theirs. xdist's worksteal hands each worker a
    contiguous share of the collection and runs it in order: a long test
    collected late would run alone at the end while the other worker idles."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def pytest_collection_finish(session):
    """Python's collector leaves out everything alive once the test modules
    are imported (`gc.freeze`): the half million objects TensorFlow, JAX,
    PyTorch and transformers keep for the whole run. A full collection,
    Python's own or the `gc.collect()` Keras runs each time a layer drops a
    variable (every Dense that `model.quantize` replaces), then walks only
    what the tests made: 0.35 s became microseconds on 2 cores, and a
    2-block model's quantize several seconds less. Nothing a test makes is
    kept longer than before."""
    import gc

    gc.freeze()


@pytest.fixture(autouse=True)
def _fresh_keras_state(monkeypatch, tmp_path_factory):
    """Each test gets an empty Keras cache dir and the default dtype policy."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path_factory.mktemp("keras_home")))
    monkeypatch.delenv("KERAS_VIT_MIRROR", raising=False)
    yield
    keras.config.set_dtype_policy("float32")
    # Keras' global state only: `free_memory=True` adds a full gc.collect(),
    # which walks the half million objects TensorFlow and friends keep alive
    # (0.3-0.5 s after every test, a quarter of the suite's time). Python's
    # own collector still frees what the test left in reference cycles.
    keras.backend.clear_session(free_memory=False)


def predict(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


# --- tiny models --------------------------------------------------------------------

def tiny_vit(**overrides):
    """A `keras_vit.VisionTransformer` of `TINY_VIT` with `overrides`, e.g.
    `tiny_vit(classifier="gap", classifier_activation=None)`."""
    import keras_vit

    return keras_vit.VisionTransformer(**{**TINY_VIT, **overrides})


def tiny_mixer(**overrides):
    """A `keras_vit.MLPMixer` of `TINY_MIXER` with `overrides`."""
    import keras_vit

    return keras_vit.MLPMixer(**{**TINY_MIXER, **overrides})


def tiny_keras_file(path, **overrides):
    """`tiny_vit(**overrides)` saved at `path` (a `.keras` file); its path as a str."""
    tiny_vit(**overrides).save(path)
    return str(path)


def random_weights(model, scale=0.2, seed=0):
    """`model` with every weight drawn from a normal distribution of standard
    deviation `scale` (seeded, in `get_weights` order); returns the model."""
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(size=w.shape).astype("float32") * scale
                       for w in model.get_weights()])
    return model


# --- the keras-vit command ----------------------------------------------------------

class CliResult(NamedTuple):
    """What `keras-vit` gave back: exit status, stdout and stderr text."""

    code: int
    out: str
    err: str

    @property
    def err_lines(self):
        """The non-empty lines of stderr."""
        return [line for line in self.err.splitlines() if line]


def run_cli(*argv):
    """`keras-vit ARGV` in this process (`keras_vit.cli.main`): its exit status
    (argparse's too), what the command wrote to its output stream, and
    everything written to stderr. (What goes to sys.stdout itself, Keras'
    progress lines and argparse's --help, is left to pytest's capture.)"""
    from keras_vit import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), _process_logging_restored():
        try:
            code = cli.main([str(a) for a in argv], out=out)
        except SystemExit as exit_:  # argparse: usage errors and --help
            code = exit_.code
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture(autouse=True)
def _logging_restored():
    """Every test starts from the logging the package sets up at import: a
    command run in this process (`cli.main`, directly, through `run_cli` or
    in a module-scoped fixture) quiets logging for the whole process."""
    _set_logging(_LOGGING_AT_IMPORT, handlers_of=("keras_vit",))  # TensorFlow adds its own
    with _process_logging_restored():
        yield


def _logging_state():
    import keras_vit  # noqa: F401  its import installs keras_vit's handler

    return [(logging.getLogger(n), logging.getLogger(n).level,
             logging.getLogger(n).propagate, list(logging.getLogger(n).handlers))
            for n in ("keras_vit", "tensorflow", "absl")]


def _set_logging(state, handlers_of=("keras_vit", "tensorflow", "absl")):
    for logger, level, propagate, handlers in state:
        logger.setLevel(level)
        logger.propagate = propagate
        if logger.name in handlers_of:
            logger.handlers[:] = handlers


_LOGGING_AT_IMPORT = _logging_state()


@contextlib.contextmanager
def _process_logging_restored():
    """A command owns its process: it quiets TensorFlow's and absl's loggers,
    stops keras_vit's from propagating and filters warnings
    (`_console.quiet`). In the test process those settings would leak into
    later tests (caplog then sees nothing), so they are put back."""
    saved = _logging_state()
    environ = {n: os.environ.get(n) for n in ("TF_CPP_MIN_LOG_LEVEL", "ABSL_MIN_LOG_LEVEL")}
    with warnings.catch_warnings():
        try:
            yield
        finally:
            _set_logging(saved)
            for name, value in environ.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def run_cli_process(*argv, launcher="keras_vit.cli", env=None, cwd=None, timeout=600):
    """`python -m LAUNCHER ARGV` in a fresh process, the repository on its
    PYTHONPATH; `env` adds variables to this process' (None removes one).
    Returns the `subprocess.CompletedProcess` (text)."""
    return subprocess.run([sys.executable, "-m", launcher, *map(str, argv)],
                          capture_output=True, text=True, env=process_env(env),
                          cwd=cwd or REPO_ROOT, timeout=timeout)


def process_env(changes=None):
    """This process' environment with the repository on PYTHONPATH and
    `changes` applied (a value of None removes the variable)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                      env.get("PYTHONPATH")]))
    for name, value in (changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = str(value)
    return env


# --- data ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def digits_folder(tmp_path_factory):
    """The quickstart's digits folder (`train/<digit>/*.png`, 1,437 images;
    `test/<digit>/*.png`, 360; 32x32), written once per session (per xdist
    worker). Read only."""
    from keras_vit.training.quickstart import write_digits

    root = tmp_path_factory.mktemp("digits") / "digits"
    write_digits(str(root))
    return root


@pytest.fixture(scope="session")
def few_digits_folder(tmp_path_factory):
    """All ten digits as 8x8 RGB PNGs of real scans: `train/<digit>/` 6 and
    `test/<digit>/` the next 3 of each (60 and 30 images), written once per
    session (per xdist worker). Read only."""
    from data_helpers import write_digit_folder

    root = tmp_path_factory.mktemp("few_digits")
    write_digit_folder(str(root), digits=range(10), splits={"train": 6, "test": 3})
    return root
