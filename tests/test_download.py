"""The real download path, against a loopback HTTP server on 127.0.0.1."""

import base64
import hashlib
import http.server
import io
import logging
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.parse

import numpy as np
import pytest

import keras_vit
from keras_vit.weights import (
    CorruptCheckpointError,
    WeightsDownloadError,
    cache,
    download,
    download_limits,
    official,
    registry,
)
from keras_vit.weights.registry import CACHE_SUBDIR
from keras_vit.weights.sources import resolve
from official_fixtures import REPO_ROOT, Fixture
from test_checkpoints import make_official_npz

AUGREG_TI16 = "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0"
SAFETY = 60  # seconds: a limit that only stops a hung test, never a timing assertion


class Server:
    """Serves `root` on 127.0.0.1 (HTTP/1.0, `Range: bytes=N-` when
    `ranges`) and records the requested paths (`requests`), their Range
    headers (`ranges`) and the body bytes sent (`sent`).

    `script[path]` lists what to do on the 1st, 2nd, ... request of `path`
    (later requests: serve normally), each a dict of:
      cut=N: send N body bytes, then close the connection;
      stall=N: send N body bytes, then send nothing until the server closes;
      hold=event: send the body once `event` is set;
      headers={...}: extra response headers (e.g. x-goog-hash).
    """

    def __init__(self, root, ranges=True):
        self.root = pathlib.Path(root)
        self.requests, self.ranges, self.sent = [], [], []
        self.script = {}
        self.ranges_supported = ranges
        self.closing = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server._serve(self)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def _serve(self, handler):
        path = handler.path
        number = self.requests.count(path)
        self.requests.append(path)
        self.ranges.append(handler.headers.get("Range"))
        self.sent.append(0)
        index = len(self.sent) - 1
        steps = self.script.get(path, [])
        step = steps[number] if number < len(steps) else {}
        file = self.root / urllib.parse.unquote(path.split("?")[0]).lstrip("/")
        if not file.is_file():
            handler.send_error(404, "File not found")
            return
        data = file.read_bytes()
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", handler.headers.get("Range") or "")
        if match and self.ranges_supported:
            start = int(match.group(1))
            if start >= len(data):
                handler.send_response(416)
                handler.send_header("Content-Range", f"bytes */{len(data)}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            handler.send_response(200)
        handler.send_header("Content-Length", str(len(data) - start))
        for key, value in step.get("headers", {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        body = data[start:]
        if "hold" in step:
            step["hold"].wait(SAFETY)
        limit = step.get("cut", step.get("stall", len(body)))
        try:
            handler.wfile.write(body[:limit])
            handler.wfile.flush()
            self.sent[index] += min(limit, len(body))
            if "stall" in step:
                self.closing.wait(SAFETY)
        except OSError:  # the client went away (a killed process)
            pass

    def put(self, relative, source=None, data=None):
        target = self.root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source is not None:
            shutil.copyfile(source, target)
        else:
            target.write_bytes(data)
        return f"{self.url}/{relative}"

    def close(self):
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "www")
    yield s
    s.close()


def cache_dir():
    return pathlib.Path(os.environ["KERAS_HOME"]) / CACHE_SUBDIR


def cache_files():
    """The cache's files, lock files (`.locks/`) left out."""
    if not cache_dir().exists():
        return []
    return sorted(p.name for p in cache_dir().iterdir() if p.name != cache.LOCKS_DIR)


def entry(name):
    """The files of a finished cache entry: the file and its provenance record."""
    return [name, name + cache.SOURCE_SUFFIX]


def test_url_downloads_once_then_uses_the_cache(server):
    fixture = Fixture("vit_tiny_token")
    url = server.put("files/vit_tiny_token.npz", fixture.checkpoint)
    first = fixture.build(weights=url)
    second = fixture.build(weights=url)
    assert server.requests == ["/files/vit_tiny_token.npz"]
    assert (cache_dir() / registry.url_cache_name(url)).is_file()
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
    assert message.endswith(
        "download truncated.npz from that URL on a machine that can reach it and copy it "
        f"to {cache_dir() / registry.url_cache_name(url)} (where this finds it), or pass "
        "weights='/path/to/truncated.npz'.")
    assert len(server.requests) == 2  # the retry
    assert cache_files() == []


def test_corrupt_cached_file_is_replaced(server, caplog):
    fixture = Fixture("vit_tiny_token")
    url = server.put("files/good.npz", fixture.checkpoint)
    cache_dir().mkdir(parents=True, exist_ok=True)
    data = pathlib.Path(fixture.checkpoint).read_bytes()
    corrupted = bytearray(data)
    corrupted[len(data) // 2] ^= 0xFF  # flips one byte inside an array: CRC error
    (cache_dir() / registry.url_cache_name(url)).write_bytes(bytes(corrupted))
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        model = fixture.build(weights=url, classifier_activation=None)
    assert "failed the integrity check" in caplog.text
    assert server.requests == ["/files/good.npz"]
    np.testing.assert_allclose(model.predict(fixture.io["images_uint8"], verbose=0),
                               fixture.io["logits"], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("content", ["npy", "html"])
def test_cached_file_of_another_format_under_an_npz_name_is_replaced(server, caplog,
                                                                     content):
    """A .npy array or an HTML page cached under the checkpoint's .npz name
    counts as corrupt: deleted and downloaded again."""
    fixture = Fixture("vit_tiny_token")
    url = server.put("files/good.npz", fixture.checkpoint)
    cache_dir().mkdir(parents=True, exist_ok=True)
    cached = cache_dir() / registry.url_cache_name(url)
    if content == "npy":
        with open(cached, "wb") as f:
            np.save(f, np.zeros(3, "float32"))
    else:
        cached.write_text("<html><body>Sign in to the proxy</body></html>")
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        model = fixture.build(weights=url, classifier_activation=None)
    assert "failed the integrity check" in caplog.text
    assert ("a single NumPy array (.npy)" if content == "npy" else "an HTML page") \
        in caplog.text
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
    # The bucket's file name, and the exact cache path `--print-url` prints.
    assert str(info.value) == (
        f"Could not download {url} (ConnectionRefusedError: [Errno 111] Connection "
        "refused). If this machine is offline or cannot reach that host, download "
        "ViT-B_16.npz from that URL on a machine that can reach it and copy it to "
        f"{cache_dir() / 'vit_models--imagenet21k--ViT-B_16.npz'} (where this finds "
        "it), or pass weights='/path/to/ViT-B_16.npz'.")
    assert isinstance(info.value, OSError)
    assert cache_files() == []


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


def test_normalize_pixels_is_the_official_formula():
    x = np.arange(256, dtype="uint8")
    np.testing.assert_array_equal(keras_vit.normalize_pixels(x),
                                  (x.astype("float32") - 127.5) / 127.5)


# --- cache keys, process-safe and resumable downloads -----------------------

SMALL = "mixer_tiny"  # the smallest official-format fixture (122 KB): cheap to read


def small_checkpoint():
    return pathlib.Path(Fixture(SMALL).checkpoint)


def goog_hash(data):
    return "crc32c=AAAAAA==,md5=" + base64.b64encode(hashlib.md5(data).digest()).decode()


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_two_urls_with_one_file_name_never_share_a_cache_entry(server, monkeypatch):
    mixer = small_checkpoint()
    vit = pathlib.Path(Fixture("vit_tiny_gap").checkpoint)
    url_a = server.put("a/model.npz", mixer)
    url_b = server.put("b/model.npz", vit)
    first = resolve(url_a, None, "model")
    second = resolve(url_b, None, "model")
    assert set(first.params) == set(official.read_checkpoint(mixer))
    assert set(second.params) == set(official.read_checkpoint(vit))  # not the first file
    assert first.path != second.path
    assert sorted(cache_files()) == sorted(entry(registry.url_cache_name(url_a))
                                           + entry(registry.url_cache_name(url_b)))
    assert re.fullmatch(r"url--[0-9a-f]{16}--model\.npz", registry.url_cache_name(url_a))
    assert server.requests == ["/a/model.npz", "/b/model.npz"]
    # An official-bucket URL and its KERAS_VIT_MIRROR copy are one entry, the
    # registered name's; the official URL is fetched from the mirror (a file
    # the official listing gives no size for: gs://vit_models/gsam).
    server.put("vit_models/gsam/ViT-B_16.npz", mixer)
    monkeypatch.setenv("KERAS_VIT_MIRROR", server.url + "/")
    official_url = "https://storage.googleapis.com/vit_models/gsam/ViT-B_16.npz"
    loaded = resolve(official_url, None, "model")
    assert loaded.path == str(cache_dir() / "vit_models--gsam--ViT-B_16.npz")
    # messages name where the bytes came from: the mirror
    assert loaded.source == (
        f"{official_url} (downloaded from {server.url}/vit_models/gsam/ViT-B_16.npz)")
    mirrored = resolve(f"{server.url}/vit_models/gsam/ViT-B_16.npz", None, "m")
    assert mirrored.path == loaded.path
    assert mirrored.source == f"{server.url}/vit_models/gsam/ViT-B_16.npz"
    assert server.requests[2:] == ["/vit_models/gsam/ViT-B_16.npz"]


def test_four_processes_on_an_empty_cache_download_once(server):
    data = small_checkpoint().read_bytes()
    url = server.put("files/model.npz", data=data)
    gate = threading.Event()  # the first download's body waits until the others wait
    server.script["/files/model.npz"] = [{"hold": gate}]
    name = registry.url_cache_name(url)
    # Only the download module: no Keras, no TensorFlow (checked below).
    code = textwrap.dedent(f"""
        import hashlib, sys, zipfile
        import keras_vit_cli, keras_vit
        from keras_vit.weights.download import fetch
        path = fetch({url!r}, {name!r})
        assert zipfile.ZipFile(path).testzip() is None  # every member's CRC
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        print(path, digest, "tensorflow" in sys.modules or "keras" in sys.modules)
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    children = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
                for _ in range(4)]
    errors = [[] for _ in children]
    readers = [threading.Thread(target=lambda c=c, e=e: e.extend(c.stderr), daemon=True)
               for c, e in zip(children, errors, strict=True)]
    for reader in readers:
        reader.start()

    def waiting():
        return sum(any("Another process is downloading" in line for line in e) for e in errors)

    deadline = time.monotonic() + SAFETY
    while not (len(server.requests) == 1 and waiting() == 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    gate.set()
    results = [child.communicate(timeout=SAFETY)[0] for child in children]
    for reader in readers:
        reader.join(SAFETY)
    assert [child.returncode for child in children] == [0] * 4, errors
    expected = f"{cache_dir() / name} {hashlib.sha256(data).hexdigest()} False\n"
    assert results == [expected] * 4
    assert server.requests == ["/files/model.npz"] and server.sent == [len(data)]
    assert waiting() == 3
    assert cache_files() == entry(name)


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_a_broken_connection_resumes_with_range(server, caplog, ranges):
    data = small_checkpoint().read_bytes()
    url = server.put("files/model.npz", data=data)
    server.ranges_supported = ranges
    half = len(data) // 2
    headers = {"x-goog-hash": goog_hash(data)}  # checked over the resumed file
    server.script["/files/model.npz"] = [{"cut": half, "headers": headers},
                                         {"headers": headers}]
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        path, params = download.fetch_checkpoint(url, registry.url_cache_name(url))
    assert pathlib.Path(path).read_bytes() == data
    assert set(params) == set(official.read_checkpoint(small_checkpoint()))
    assert server.ranges == [None, f"bytes={half}-"]
    assert f"The download of {url} stopped at byte {half:,} (the connection closed " \
           f"after {half:,} of {len(data):,} bytes); resuming." in caplog.text
    if ranges:
        assert server.sent == [half, len(data) - half]  # only the missing bytes
    else:  # the server ignores Range: the whole file again, from the start
        assert server.sent == [half, len(data)]
        assert "the server does not resume downloads" in caplog.text
    assert cache_files() == entry(registry.url_cache_name(url))
    # the record's SHA-256 is of the whole file, across the resume
    assert cache.provenance(path)["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_stalled_connection_is_a_clear_error(server, monkeypatch):
    data = small_checkpoint().read_bytes()
    url = server.put("files/model.npz", data=data)
    server.script["/files/model.npz"] = [{"stall": 10_000}, {"stall": 0}]
    monkeypatch.setenv("KERAS_VIT_DOWNLOAD_TIMEOUT", "1")
    name = registry.url_cache_name(url)
    with pytest.raises(WeightsDownloadError) as info:
        download.fetch_checkpoint(url, name)
    partial = cache_dir() / (name + ".incomplete")
    assert str(info.value) == (
        f"Could not download {url} (no data for 1 s, the limit KERAS_VIT_DOWNLOAD_TIMEOUT "
        f"sets; set it higher for a slow link; 10,000 of {len(data):,} bytes are kept in "
        f"{partial} and the next attempt resumes from there). If this machine is offline or "
        f"cannot reach that host, download model.npz from that URL on a machine that can "
        f"reach it and copy it to {cache_dir() / name} (where this finds it), or pass "
        "weights='/path/to/model.npz'.")
    assert server.ranges == [None, "bytes=10000-"]
    assert partial.read_bytes() == data[:10_000]
    assert cache_files() == [name + ".incomplete"]  # nothing unverified at the final path


def test_download_timeout_is_validated(monkeypatch):
    for value in ["soon", "0", "-5", "nan", "inf"]:
        monkeypatch.setenv("KERAS_VIT_DOWNLOAD_TIMEOUT", value)
        with pytest.raises(ValueError) as info:
            download.fetch("http://127.0.0.1:9/never.npz", "never.npz")
        assert str(info.value) == (
            "KERAS_VIT_DOWNLOAD_TIMEOUT must be a positive number of seconds (e.g. 60), "
            f"got {value!r}.")
    monkeypatch.setenv("KERAS_VIT_DOWNLOAD_TIMEOUT", " 2.5 ")
    assert download_limits.download_timeout() == 2.5


def test_a_killed_downloader_leaves_a_lock_that_blocks_nobody(server, monkeypatch):
    data = small_checkpoint().read_bytes()
    url = server.put("files/model.npz", data=data)
    server.script["/files/model.npz"] = [{"stall": 40_000}]
    name = registry.url_cache_name(url)
    code = ("import keras_vit_cli, keras_vit\n"
            "from keras_vit.weights.download import fetch\n"
            f"fetch({url!r}, {name!r})\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    partial = cache_dir() / (name + ".incomplete")
    deadline = time.monotonic() + SAFETY
    while not (partial.exists() and partial.stat().st_size == 40_000) and time.monotonic() < deadline:
        time.sleep(0.02)
    child.kill()  # SIGKILL mid-download: no cleanup runs
    child.wait(SAFETY)
    assert (cache_dir() / ".locks" / (name + ".lock")).exists()
    assert partial.stat().st_size == 40_000
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    path, _ = download.fetch_checkpoint(url, name)
    assert pathlib.Path(path).read_bytes() == data
    assert server.ranges == [None, "bytes=40000-"]
    assert server.sent[1] == len(data) - 40_000
    first_frame = terminal.getvalue().split("\r")[1]
    assert first_frame.startswith(f"model.npz 39.1/{len(data) / 1024:.1f} KiB ━")  # where it stopped
    assert cache_files() == entry(name)
    # the SHA-256 covers the bytes the killed process wrote too
    assert cache.provenance(path)["sha256"] == hashlib.sha256(data).hexdigest()


def test_an_md5_mismatch_with_x_goog_hash_is_refused(server):
    data = small_checkpoint().read_bytes()
    url = server.put("files/model.npz", data=data)
    wrong = goog_hash(b"another file")
    server.script["/files/model.npz"] = [{"headers": {"x-goog-hash": wrong}}] * 2
    name = registry.url_cache_name(url)
    with pytest.raises(CorruptCheckpointError) as info:
        download.fetch_checkpoint(url, name)
    got = base64.b64encode(hashlib.md5(data).digest()).decode()
    assert str(info.value) == (
        f"The checkpoint downloaded from {url} is corrupt (its MD5 is {got} but the "
        f"server's x-goog-hash says md5={wrong.split('md5=')[1]}), twice in a row; the "
        "file was removed from the cache. Check the URL or your mirror, or download "
        "model.npz from that URL on a machine that can reach it and copy it to "
        f"{cache_dir() / name} (where this finds it), or pass weights='/path/to/model.npz'.")
    assert len(server.requests) == 2
    assert cache_files() == []


def test_augreg_file_names_cannot_leave_the_cache():
    from keras_vit.variants import VIT_VARIANTS

    with pytest.raises(ValueError) as info:
        registry.lookup("augreg:B_16-x/../../evil", VIT_VARIANTS["B/16"], "ViT-B_16")
    assert str(info.value) == (
        "AugReg file name 'B_16-x/../../evil' is not a file name: it may hold letters, "
        "digits and '._+-' only (no '/'), e.g. "
        "'augreg:B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0'.")
