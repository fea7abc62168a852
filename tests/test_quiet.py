"""What keras_vit writes and prints unasked (issue #49): `import keras_vit`
prints nothing; `model.quantize` on a keras_vit model warns about nothing;
`train` saves `model.keras` and `best.keras` as the model alone (no
optimizer state, its size in the results), which a fresh process reloads,
quantizes (under `-W error::UserWarning`) and reloads again without a
word; and `train(verbose=1)` writing
to a file or pipe prints one plain line per epoch, as the CLI does."""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import warnings
import zipfile

import h5py
import keras
import numpy as np
import pytest
from data_helpers import make_folder

from conftest import predict, process_env, random_weights, tiny_keras_file, tiny_mixer, tiny_vit
from keras_vit import _console
from keras_vit._framework_text import QUANTIZE_SKIPPED
from keras_vit.training import trainer

IMAGES = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")


@pytest.mark.backends
def test_import_keras_vit_writes_nothing():
    """TensorFlow's and jaxlib's native start-up lines (absl's banner,
    oneDNN, the CUDA stubs, the CPU feature guard, cuInit) included; on
    each backend (the child inherits KERAS_BACKEND)."""
    env = process_env({"TF_CPP_MIN_LOG_LEVEL": None, "ABSL_MIN_LOG_LEVEL": None})
    result = subprocess.run([sys.executable, "-c", "import keras_vit"], capture_output=True,
                            text=True, env=env, timeout=300)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.backends
@pytest.mark.parametrize("build", [
    lambda: tiny_vit(classifier="gap", layer_scale_init=1e-5, num_register_tokens=2,
                     fc_norm=True, dropout_rate=0.1, drop_path_rate=0.1),
    lambda: tiny_vit(resnet_layers=(1,), resnet_width=1, patch_size=1),
    lambda: tiny_mixer(),
    lambda: tiny_vit(features_only=True, classes=None),
], ids=["vit", "hybrid", "mixer", "features"])
def test_every_warning_of_quantize_on_a_keras_vit_model_is_one_keras_vit_hides(build):
    """Keras 3.13-3.15 warns once for each class of leaf layer it leaves in
    float; every one of those for a keras_vit model is in the pattern that
    `keras_vit.layers` filters out (shown here with "always" in front of
    it; the fresh process below has it as an import leaves it). A Keras
    that words it otherwise fails here."""
    model = random_weights(build())
    before = predict(model, IMAGES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        model.quantize("int8")
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert said and [m for m in said if not re.match(QUANTIZE_SKIPPED, m)] == []
    assert not np.allclose(predict(model, IMAGES), before)  # the blocks' Dense are int8


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two epochs of a tiny model with AdamW (the `scratch` recipe), Keras'
    verbosity 1, stdout a StringIO: (run folder, results, what it printed)."""
    root = tmp_path_factory.mktemp("quiet")
    make_folder(str(root / "data"), per_class=6, size=32)
    tiny_keras_file(root / "tiny.keras", classifier="gap", classifier_activation=None)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        results = trainer.train(str(root / "tiny.keras"), f"folder:{root / 'data'}",
                                out=str(root / "run"), recipe="scratch", epochs=2, verbose=1)
    return root / "run", results, printed.getvalue()


def test_train_to_a_file_prints_one_plain_line_per_epoch(run):
    _, _, printed = run
    assert not any(c in printed for c in "\r\b\x1b"), repr(printed)
    lines = printed.strip().splitlines()
    assert [line for line in lines if line.startswith("Epoch ")] == ["Epoch 1/2", "Epoch 2/2"]
    assert len([line for line in lines if " - loss: " in line]) == 2, lines
    assert _console.progress_verbosity(1, io.StringIO()) == 2
    assert _console.progress_verbosity(2, io.StringIO()) == 2
    assert _console.progress_verbosity(0, io.StringIO()) == 0


def _optimizer_state(path):
    """(config.json has a compile config, the weights file an optimizer)."""
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
        with archive.open("model.weights.h5") as member, h5py.File(io.BytesIO(
                member.read()), "r") as weights:
            return bool(config.get("compile_config")), "optimizer" in weights


def test_model_keras_holds_the_model_without_optimizer_state(run):
    folder, results, _ = run
    model_path = folder / "model.keras"
    assert results["model"] == str(model_path)
    assert results["model_size_mb"] == round(os.path.getsize(model_path) / 1e6, 3)
    assert _optimizer_state(model_path) == (False, False)
    assert _optimizer_state(folder / "best.keras") == (False, False)


def test_model_keras_reloads_quantizes_and_reloads_in_a_fresh_process_without_a_word(
        run, tmp_path):
    """Predicts as in this process; `model.quantize` and a reload of the
    quantized file say nothing ("Skipping variable loading for
    optimizer" came from the optimizer state model.keras held)."""
    folder, _, _ = run
    np.save(tmp_path / "images.npy", IMAGES)
    code = ("import keras_vit\n"  # first: TensorFlow then loads in its import
            "import sys, numpy as np, keras\n"
            "model = keras.saving.load_model(sys.argv[1])\n"
            "np.save(sys.argv[2], keras.ops.convert_to_numpy(model(np.load(sys.argv[3]))))\n"
            "model.quantize('int8')\n"
            "model.save(sys.argv[4])\n"
            "keras.saving.load_model(sys.argv[4])\n")
    result = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", code, str(folder / "model.keras"),
         str(tmp_path / "logits.npy"), str(tmp_path / "images.npy"), str(tmp_path / "q.keras")],
        capture_output=True, text=True, timeout=300,
        env=process_env({"TF_CPP_MIN_LOG_LEVEL": None}))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    reloaded = keras.saving.load_model(folder / "model.keras")
    assert not reloaded.compiled
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), predict(reloaded, IMAGES),
                               atol=1e-5)
