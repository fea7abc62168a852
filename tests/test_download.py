"""The real download path, against a loopback HTTP server on 127.0.0.1."""

import functools
import http.server
import logging
import os
import pathlib
import shutil
import socket
import threading

import numpy as np
import pytest

import keras_vit
from keras_vit.weights import CorruptCheckpointError, WeightsDownloadError, official
from keras_vit.weights.download import CACHE_SUBDIR
from official_fixtures import Fixture
from test_checkpoints import make_official_npz

AUGREG_TI16 = "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0"


class Server:
    """Serves `root` on 127.0.0.1 and records the requested paths."""

    def __init__(self, root):
        self.root = pathlib.Path(root)
        self.requests = []
        requests = self.requests

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        handler = functools.partial(Handler, directory=str(self.root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def put(self, relative, source=None, data=None):
        target = self.root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source is not None:
            shutil.copyfile(source, target)
        else:
            target.write_bytes(data)
        return f"{self.url}/{relative}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "www")
    yield s
    s.close()


def cache_dir():
    return pathlib.Path(os.environ["KERAS_HOME"]) / CACHE_SUBDIR


def test_url_downloads_once_then_uses_the_cache(server):
    fixture = Fixture("vit_tiny_token")
    url = server.put("files/vit_tiny_token.npz", fixture.checkpoint)
    first = fixture.build(weights=url)
    second = fixture.build(weights=url)
    assert server.requests == ["/files/vit_tiny_token.npz"]
    assert (cache_dir() / "url--vit_tiny_token.npz").is_file()
    images = fixture.io["images_uint8"]
    np.testing.assert_array_equal(first.predict(images, verbose=0), second.predict(images, verbose=0))


@pytest.fixture(scope="module")
def augreg_ti16(tmp_path_factory):
    """A full-size ViT-Ti/16 file in the AugReg i21k layout (21,843 classes,
    no pre_logits), made by the official-format generator."""
    architecture = keras_vit.ViTTi16(classes=21843)
    path = make_official_npz(official.official_manifest(architecture), 11,
                             tmp_path_factory.mktemp("augreg"))
    return path


def test_registered_name_downloads_from_the_mirror(server, monkeypatch, augreg_ti16, caplog):
    server.put(f"vit_models/augreg/{AUGREG_TI16}.npz", augreg_ti16)
    monkeypatch.setenv("KERAS_VIT_MIRROR", server.url)
    model = keras_vit.ViTTi16(weights="augreg")
    assert server.requests == [f"/vit_models/augreg/{AUGREG_TI16}.npz"]
    assert model.output_shape == (None, 21843)
    expected = np.load(augreg_ti16)["head/bias"]
    np.testing.assert_array_equal(model.get_layer("head").bias.numpy(), expected)
    # fine-tuning head from the cache, no second request
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        tuned = keras_vit.ViTTi16(weights="augreg", classes=10, input_shape=(384, 384, 3))
    assert len(server.requests) == 1
    assert tuned.output_shape == (None, 10)
    assert "replacing the checkpoint's 21843-class head" in caplog.text
    assert "from a 14x14 to a 24x24 grid" in caplog.text


def test_truncated_download_is_a_clear_error_and_leaves_no_cache(server):
    fixture = Fixture("vit_tiny_token")
    data = pathlib.Path(fixture.checkpoint).read_bytes()
    url = server.put("files/truncated.npz", data=data[: len(data) // 2])
    with pytest.raises(CorruptCheckpointError) as info:
        fixture.build(weights=url)
    message = str(info.value)
    assert message.startswith(f"The checkpoint downloaded from {url} is corrupt (")
    assert "twice in a row; the file was removed from the cache" in message
    assert "pass weights='/path/to/url--truncated.npz'" in message
    assert len(server.requests) == 2  # the retry
    assert not (cache_dir() / "url--truncated.npz").exists()


def test_corrupt_cached_file_is_replaced(server, caplog):
    fixture = Fixture("vit_tiny_token")
    url = server.put("files/good.npz", fixture.checkpoint)
    cache_dir().mkdir(parents=True, exist_ok=True)
    data = pathlib.Path(fixture.checkpoint).read_bytes()
    corrupted = bytearray(data)
    corrupted[len(data) // 2] ^= 0xFF  # flips one byte inside an array: CRC error
    (cache_dir() / "url--good.npz").write_bytes(bytes(corrupted))
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        model = fixture.build(weights=url, classifier_activation=None)
    assert "failed the integrity check" in caplog.text
    assert server.requests == ["/files/good.npz"]
    np.testing.assert_allclose(model.predict(fixture.io["images_uint8"], verbose=0),
                               fixture.io["logits"], rtol=1e-5, atol=2e-5)


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_host_gives_the_offline_error(monkeypatch):
    base = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("KERAS_VIT_MIRROR", base)
    url = f"{base}/vit_models/imagenet21k/ViT-B_16.npz"
    with pytest.raises(WeightsDownloadError) as info:
        keras_vit.ViTB16(weights="imagenet21k")
    message = str(info.value)
    assert message.startswith(f"Could not download {url} (URL fetch failure on {url}")
    assert message.endswith(
        "If this machine is offline or cannot reach that host, download it elsewhere "
        "and pass weights='/path/to/vit_models--imagenet21k--ViT-B_16.npz'.")
    assert isinstance(info.value, OSError)
    assert not list(cache_dir().glob("*"))


def test_missing_file_on_the_server(server, monkeypatch):
    monkeypatch.setenv("KERAS_VIT_MIRROR", server.url)
    with pytest.raises(WeightsDownloadError, match="404"):
        keras_vit.MixerB16(weights="imagenet1k")
    assert server.requests == ["/mixer_models/imagenet1k/Mixer-B_16.npz"]


def test_plus_in_folder_names_is_quoted(server, monkeypatch):
    monkeypatch.setenv("KERAS_VIT_MIRROR", server.url)
    with pytest.raises(WeightsDownloadError):
        keras_vit.ViTB16(weights="imagenet21k+imagenet2012-224")
    assert server.requests == ["/vit_models/imagenet21k%2Bimagenet2012/ViT-B_16-224.npz"]


def test_decode_predictions_downloads_the_label_file(server, monkeypatch):
    names = [f"label {i}" for i in range(1000)]
    server.put("bit_models/ilsvrc2012_wordnet_lemmas.txt", data="\n".join(names).encode())
    monkeypatch.setenv("KERAS_VIT_MIRROR", server.url)
    keras_vit.preprocessing._cache.clear()
    scores = np.zeros((2, 1000), "float32")
    scores[0, 7], scores[0, 3], scores[1, 999] = 0.9, 0.05, 1.0
    decoded = keras_vit.decode_predictions(scores, top=2)
    assert decoded[0] == [(7, "label 7", pytest.approx(0.9)), (3, "label 3", pytest.approx(0.05))]
    assert decoded[1][0] == (999, "label 999", 1.0)
    keras_vit.decode_predictions(scores, top=1)
    assert server.requests == ["/bit_models/ilsvrc2012_wordnet_lemmas.txt"]
    keras_vit.preprocessing._cache.clear()


def test_decode_predictions_errors():
    with pytest.raises(ValueError, match=r"No label file for a 7-class head; registered: \[1000, 21843\]"):
        keras_vit.decode_predictions(np.zeros((1, 7)))
    with pytest.raises(ValueError, match=r"`labels` has 2 names but `preds` has 3 classes\."):
        keras_vit.decode_predictions(np.zeros((1, 3)), labels=["a", "b"])
    with pytest.raises(ValueError, match=r"`preds` must be a 2-D \(batch, classes\) array, got shape \(3,\)\."):
        keras_vit.decode_predictions(np.zeros(3), labels=["a", "b", "c"])


def test_preprocess_input_is_the_official_formula():
    x = np.arange(256, dtype="uint8")
    np.testing.assert_array_equal(keras_vit.preprocess_input(x),
                                  (x.astype("float32") - 127.5) / 127.5)
