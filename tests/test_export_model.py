"""keras_vit.export on models keras_vit did not build (the model
introspection of `keras_vit/export`): Sequential and subclassed
classifiers, their input shape and whether they output logits or
probabilities."""

import json

import keras
import numpy as np
import pytest

from conftest import run_cli

TF = keras.backend.backend() == "tensorflow"
tf_only = pytest.mark.skipif(not TF, reason="the TensorFlow backend's paths")


def _sequential(build):
    layers = [keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
              keras.layers.Dense(4, activation="softmax")]
    if build == "input":
        return keras.Sequential([keras.Input((16, 16, 3)), *layers])
    model = keras.Sequential(layers)
    model.build((None, 16, 16, 3))
    return model


@tf_only
@pytest.mark.parametrize("build", ["input", "build"])
def test_cli_exports_a_sequential_softmax_classifier(tmp_path, build):
    path = tmp_path / "seq.keras"
    _sequential(build).save(path)
    status, stdout, err = run_cli("export", str(path), "--format", "tflite", "--out",
                                  str(tmp_path / "seq.tflite"), "--json")
    assert status == 0, err
    report = json.loads(stdout)
    assert report["passed"] and report["max_abs_diff"] < 1e-4


@tf_only
def test_subclassed_classifier_exports_with_named_outputs(tmp_path):
    from keras_vit import export

    class Classifier(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.flatten = keras.layers.Flatten()
            self.dense = keras.layers.Dense(4)

        def call(self, x):
            return self.dense(self.flatten(x / 255.0))

    model = Classifier(name="mine")
    with pytest.raises(ValueError, match=(
            r"^'mine' \(Classifier\) has no known input shape: a subclassed model is built by "
            r"its first call\. Call it once on a batch of images, e\.g\. model\(np\.zeros\(\(1, "
            r"224, 224, 3\)\)\), or model\.build\(\(None, 224, 224, 3\)\), before exporting\.$")):
        export.to_tflite(model, tmp_path / "m.tflite", verbose=False)
    model(np.zeros((1, 16, 16, 3), "float32"))
    with pytest.raises(ValueError, match=(
            r"^Cannot tell whether 'mine' outputs logits or probabilities: it is a subclassed "
            r"model \(Classifier\), whose last operation only its call\(\) knows; pass "
            r"outputs='logits' or outputs='probabilities'\.$")):
        export.to_tflite(model, tmp_path / "m.tflite", verbose=False)
    for fn, out in ((export.to_tflite, "m.tflite"), (export.to_saved_model, "m_sm")):
        report = fn(model, tmp_path / out, outputs="logits", verbose=False)
        assert report.passed and report.max_abs_diff < 1e-4
