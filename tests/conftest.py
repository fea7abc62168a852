import keras
import pytest


@pytest.fixture(autouse=True)
def _fresh_keras_state(monkeypatch, tmp_path_factory):
    """Each test gets an empty Keras cache dir and the default dtype policy."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path_factory.mktemp("keras_home")))
    monkeypatch.delenv("KERAS_VIT_MIRROR", raising=False)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()


def predict(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))
