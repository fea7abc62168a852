"""keras_vit.weights.download, its records and bounds: where a cached file
came from (provenance records), the official sizes, and the bounds of a
download (size, free space, deadline, retries of a busy server). Every
server is a loopback one on 127.0.0.1 whose loops end by themselves."""

import collections
import datetime
import email.utils
import hashlib
import http.server
import json
import logging
import os
import pathlib
import re
import threading
import time

import pytest

import keras_vit
from conftest import run_cli
from keras_vit.variants import ALL_VARIANTS, VIT_VARIANTS
from keras_vit.weights import (
    CheckpointMismatchError,
    WeightsDownloadError,
    cache,
    download,
    download_limits,
    registry,
    transfer,
)
from keras_vit.weights.sources import resolve
from test_download import Server, cache_dir, cache_files, closed_port, entry, small_checkpoint

SAFETY = 30  # seconds: a bound that only ends a hung server loop, never an assertion
HINT = ("If this machine is offline or cannot reach that host, download model.npz from that "
        "URL on a machine that can reach it and copy it to {path} (where this finds it), or "
        "pass weights='/path/to/model.npz'.")


class Scripted:
    """A loopback HTTP/1.0 server whose n-th request gets `answers[n]` (the
    last one repeats): each a function of the request handler. Records the
    request paths, their Range headers and the body bytes sent."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests, self.ranges, self.sent = [], [], []
        self.stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                index = len(server.requests)
                server.requests.append(self.path)
                server.ranges.append(self.headers.get("Range"))
                server.sent.append(0)
                answer = server.answers[min(index, len(server.answers) - 1)]
                try:
                    answer(self, lambda n: server._count(index, n))
                except OSError:  # the client went away
                    pass

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def _count(self, index, n):
        self.sent[index] += n

    def close(self):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted():
    servers = []

    def make(*answers):
        servers.append(Scripted(*answers))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def serve(data, headers=None):
    """The file `data` (a Range request gets its part)."""
    def answer(handler, sent):
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", handler.headers.get("Range") or "")
        if match:
            start = int(match.group(1))
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            handler.send_response(200)
        handler.send_header("Content-Length", str(len(data) - start))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data[start:])
        sent(len(data) - start)
    return answer


def cut(data, n):
    """The whole file announced, `n` bytes of it sent, then the connection closed."""
    def answer(handler, sent):
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data[:n])
        sent(n)
    return answer


def status(code, headers=None):
    def answer(handler, sent):
        handler.send_response(code)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    return answer


def unannounced(data):
    """`data` without a Content-Length (the body ends when the connection closes)."""
    def answer(handler, sent):
        handler.send_response(200)
        handler.end_headers()
        handler.wfile.write(data)
        sent(len(data))
    return answer


def endless(stop, limit=64 << 20):
    """Zeros without a Content-Length, 64 KiB at a time, until the client
    goes away (or `limit` bytes, or `stop`: a bound for the test only)."""
    def answer(handler, sent):
        handler.send_response(200)
        handler.end_headers()
        block = bytes(64 << 10)
        for _ in range(limit // len(block)):
            if stop.is_set():
                break
            handler.wfile.write(block)
            sent(len(block))
    return answer


def announces(length, body=b"x" * 100):
    def answer(handler, sent):
        handler.send_response(200)
        handler.send_header("Content-Length", str(length))
        handler.end_headers()
        handler.wfile.write(body)
        sent(len(body))
    return answer


def trickle(stop, total=1000, every=0.5):
    """One byte every `every` s of a `total`-byte file (at most SAFETY s)."""
    def answer(handler, sent):
        handler.send_response(200)
        handler.send_header("Content-Length", str(total))
        handler.end_headers()
        for _ in range(min(total, int(SAFETY / every))):
            if stop.wait(every):
                break
            handler.wfile.write(b"x")
            handler.wfile.flush()
            sent(1)
    return answer


@pytest.fixture
def waits(monkeypatch):
    """The backoff waits, recorded instead of slept."""
    recorded = []
    monkeypatch.setattr(transfer, "_sleep", recorded.append)
    return recorded


def name_of(url):
    return registry.url_cache_name(url)


def hint(url):
    return HINT.format(path=cache_dir() / name_of(url))


# --- provenance and official sizes --------------------------------------------

SAM_B16 = registry.EXPECTED_SIZES["vit_models/sam/ViT-B_16.npz"]
SAM_B16_SIZE = ("330.3 MiB (346,339,410 to 346,349,895 bytes) per the official vit_jax.ipynb "
                "bucket listing (gsutil ls -lh)")


def test_a_mirror_download_records_where_its_bytes_came_from(monkeypatch, tmp_path):
    data = small_checkpoint().read_bytes()
    server = Server(tmp_path / "www")
    try:
        server.put("vit_models/gsam/ViT-S_32.npz", data=data)  # a Mixer: the wrong file
        mirrored = f"{server.url}/vit_models/gsam/ViT-S_32.npz"
        monkeypatch.setenv("KERAS_VIT_MIRROR", server.url)
        expected = (f"Checkpoint 'gsam' ({mirrored}) is a Mixer checkpoint; it does not")
        with pytest.raises(CheckpointMismatchError, match=re.escape(expected)):
            keras_vit.ViTS32(weights="gsam")
        path = cache_dir() / "vit_models--gsam--ViT-S_32.npz"
        record = json.loads(pathlib.Path(f"{path}.source.json").read_text())
        assert record["url"] == mirrored
        assert record["bytes"] == len(data) == path.stat().st_size
        assert record["sha256"] == hashlib.sha256(data).hexdigest()
        date = datetime.datetime.strptime(record["date"], "%Y-%m-%dT%H:%M:%SZ")
        now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
        assert abs((now - date).total_seconds()) < 600
        assert cache.provenance(str(path)) == record
        assert cache_files() == entry(path.name)  # no temporary left
        # A later run without the mirror reads the cache: its messages still
        # name the mirror, not https://storage.googleapis.com.
        monkeypatch.delenv("KERAS_VIT_MIRROR")
        with pytest.raises(CheckpointMismatchError, match=re.escape(expected)):
            keras_vit.ViTS32(weights="gsam")
        official = "https://storage.googleapis.com/vit_models/gsam/ViT-S_32.npz"
        assert resolve(official, None, "m").source == (
            f"{official} (downloaded from {mirrored})")
        code, out, _ = run_cli("download", "gsam", "--model", "ViTS32")
        assert code == 0
        assert out.startswith(f"Already cached: {path} (")
        assert out.endswith(f" arrays, from {mirrored})\n")
        assert server.requests == ["/vit_models/gsam/ViT-S_32.npz"]
    finally:
        server.close()


def test_a_replaced_or_hand_copied_cache_file_has_no_origin(tmp_path):
    data = small_checkpoint().read_bytes()
    server = Server(tmp_path / "www")
    try:
        url = server.put("files/model.npz", data=data)
        path = resolve(url, None, "m").path
    finally:
        server.close()
    assert cache.provenance(path)["url"] == url
    pathlib.Path(path).write_bytes(data)  # the same bytes copied over it: a new mtime
    os.utime(path, ns=(1, 1))
    assert cache.provenance(path) is None
    assert cache.cached_source(url, path) == (
        f"{url} ({path}, origin unknown: no download record)")
    os.remove(path + ".source.json")
    assert cache.cached_source("sam", path) == (
        f"'sam' ({path}, origin unknown: no download record)")


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "unannounced"])
def test_a_mirror_file_of_another_size_than_the_official_is_refused(
        scripted, monkeypatch, announced):
    data = small_checkpoint().read_bytes()
    server = scripted(serve(data) if announced else unannounced(data))
    monkeypatch.setenv("KERAS_VIT_MIRROR", server.url)
    url = f"{server.url}/vit_models/sam/ViT-B_16.npz"
    with pytest.raises(WeightsDownloadError) as info:
        resolve("sam", VIT_VARIANTS["B/16"], "ViT-B_16")
    received = "the server announces" if announced else "it sent"
    assert str(info.value) == (
        f"Could not download {url}: {received} {len(data):,} bytes but the official file "
        f"is {SAM_B16_SIZE}; nothing was kept in the cache (check the URL or your mirror, "
        "KERAS_VIT_MIRROR).")
    assert server.requests == ["/vit_models/sam/ViT-B_16.npz"]  # not tried again
    assert cache_files() == []


def test_an_unannounced_body_longer_than_the_official_file_is_stopped(scripted, monkeypatch):
    # (a small stated size stands for the official one: the test streams kilobytes)
    small = registry.StatedSize("1 KiB", 1000, 1100, "test's listing")
    monkeypatch.setitem(registry.EXPECTED_SIZES, "vit_models/sam/ViT-B_16.npz", small)
    server = scripted(unannounced(bytes(5000)))
    monkeypatch.setenv("KERAS_VIT_MIRROR", server.url)
    url = f"{server.url}/vit_models/sam/ViT-B_16.npz"
    with pytest.raises(WeightsDownloadError) as info:
        download.fetch(url, "vit_models--sam--ViT-B_16.npz")
    assert re.fullmatch(
        re.escape(f"Could not download {url}: it sent more than 1,100 bytes (") + r"[\d,]+"
        + re.escape(" so far) but the official file is 1 KiB (1,000 to 1,100 bytes) per the "
                    "test's listing; stopped there, and nothing was kept in the cache (check "
                    "the URL or your mirror, KERAS_VIT_MIRROR)."), str(info.value))
    assert cache_files() == []


def test_a_cached_file_of_another_size_is_downloaded_again(monkeypatch, caplog):
    base = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("KERAS_VIT_MIRROR", base)
    cache_dir().mkdir(parents=True)
    copied = cache_dir() / "vit_models--sam--ViT-B_16.npz"
    copied.write_bytes(small_checkpoint().read_bytes())  # copied in by hand: no record
    with caplog.at_level(logging.WARNING, logger="keras_vit"), \
            pytest.raises(WeightsDownloadError, match="Connection refused"):
        resolve("sam", VIT_VARIANTS["B/16"], "ViT-B_16")
    size = len(small_checkpoint().read_bytes())
    assert (f"The checkpoint {copied} (origin unknown: no download record) failed the "
            f"integrity check (it has {size:,} bytes but the official file is "
            f"{SAM_B16_SIZE}); deleting it and downloading it again.") in caplog.text
    assert not copied.exists()


def test_the_sizes_add_up_to_the_listing_totals():
    """Each listed size is exact to 0.005 of its unit (gsutil rounds to two
    decimals); the listing's "TOTAL: ... bytes" lines are exact sums, so
    they must lie within the sums of the ranges."""
    def total(prefix):
        sizes = [s for path, s in registry.EXPECTED_SIZES.items()
                 if path.startswith(prefix) and s.source == registry.LISTING]
        return len(sizes), sum(s.low for s in sizes), sum(s.high for s in sizes)

    # gsutil ls -lh gs://vit_models/imagenet*: "TOTAL: 17 objects, 14306096550 bytes"
    count, low, high = total("vit_models/imagenet21k")
    assert count == 17 and low <= 14_306_096_550 <= high
    # gs://vit_models/sam: "TOTAL: 5 objects, 3407859850 bytes (3.17 GiB)"
    count, low, high = total("vit_models/sam/")
    assert count == 5 and low <= 3_407_859_850 <= high
    # gs://mixer_models/*: "TOTAL: 12 objects, 3489219014 bytes", one of them
    # the 6-byte "gs://mixer_models/sam_$folder$"
    count, low, high = total("mixer_models/")
    assert count == 11 and low <= 3_489_219_014 - 6 <= high
    assert registry.EXPECTED_SIZES["vit_models/imagenet21k/ViT-H_14.npz"].high < \
        download_limits.DEFAULT_MAX_BYTES  # the largest official file fits the default cap
    assert max(s.high for s in registry.EXPECTED_SIZES.values()) < download_limits.DEFAULT_MAX_BYTES


def test_which_registered_files_have_an_official_size():
    unsized = set()
    for variant in ALL_VARIANTS.values():
        for name in registry.families_for(variant):
            remote = registry.lookup(name, variant, variant.official_name)
            if registry.expected_size(remote.url) is None:
                unsized.add(remote.url.split("/", 3)[3])
    # No official source states these sizes: the GSAM ViTs, the AugReg
    # fine-tunes and AugReg B/8 (not in the README's AugReg table).
    assert all(u.startswith(("vit_models/gsam/", "vit_models/augreg/")) for u in unsized)
    assert sorted(u for u in unsized if u.startswith("vit_models/gsam/")) == [
        f"vit_models/gsam/ViT-{k}.npz" for k in ["B_16", "B_32", "S_16", "S_32"]]
    augreg = sorted(u for u in unsized if u.startswith("vit_models/augreg/"))
    assert len(augreg) == 11 and sum("--imagenet2012-" not in u for u in augreg) == 1
    assert "vit_models/augreg/B_8-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0.npz" \
        in augreg
    ti16 = registry.url_for("vit_models/augreg", registry._AUGREG_I21K["Ti/16"])
    readme = registry.expected_size(ti16)
    assert (readme.text, readme.low, readme.high) == ("37 MiB", 36 << 20, 38 << 20)
    # a mirror URL and a quoted "+" find the same size
    assert registry.expected_size(
        "https://storage.googleapis.com/vit_models/imagenet21k%2Bimagenet2012/ViT-B_16.npz"
    ).text == "331.4 MiB"
    assert registry.expected_size(
        "https://storage.googleapis.com/vit_models/sam/ViT-B_16.npz?x=1") is None


# --- size, free space, deadline, retries --------------------------------------

def test_an_endless_body_without_content_length_stops_at_the_cap(scripted, monkeypatch):
    stop = threading.Event()
    server = scripted(endless(stop))
    monkeypatch.setenv("KERAS_VIT_MAX_DOWNLOAD_BYTES", str(1 << 20))
    url = f"{server.url}/files/model.npz"
    with pytest.raises(WeightsDownloadError) as info:
        download.fetch(url, name_of(url))
    stop.set()
    assert str(info.value) == (
        f"Could not download {url}: it sent more than the 1,048,576 bytes that "
        "KERAS_VIT_MAX_DOWNLOAD_BYTES allows, without announcing its size; stopped there, "
        "and nothing was kept in the cache (set it higher for a bigger file).")
    assert cache_files() == []  # no partial file either
    assert len(server.requests) == 1


def test_a_huge_content_length_is_refused_before_writing(scripted):
    server = scripted(announces(10**15))
    url = f"{server.url}/files/model.npz"
    with pytest.raises(WeightsDownloadError) as info:
        download.fetch(url, name_of(url))
    assert str(info.value) == (
        f"Could not download {url}: the server announces 1,000,000,000,000,000 bytes, more "
        "than the 4,294,967,296 that KERAS_VIT_MAX_DOWNLOAD_BYTES allows (set it higher "
        "for a bigger file); nothing was kept in the cache.")
    assert cache_files() == [] and len(server.requests) == 1


def test_a_file_larger_than_the_free_space_is_refused_before_writing(scripted, monkeypatch):
    data = small_checkpoint().read_bytes()
    server = scripted(serve(data))
    url = f"{server.url}/files/model.npz"
    Usage = collections.namedtuple("Usage", "total used free")
    asked = []

    def disk_usage(path):
        asked.append(path)
        return Usage(10**12, 10**12 - len(data) + 1, len(data) - 1)

    monkeypatch.setattr(transfer.shutil, "disk_usage", disk_usage)
    with pytest.raises(WeightsDownloadError) as info:
        download.fetch(url, name_of(url))
    assert str(info.value) == (
        f"Could not download {url}: it needs {len(data):,} more bytes in {cache_dir()}, "
        f"which has {len(data) - 1:,} bytes free; free some space, or set KERAS_HOME to a "
        "folder on a bigger disk.")
    assert asked == [str(cache_dir())]
    assert cache_files() == []


def test_a_slow_server_hits_the_deadline(scripted, monkeypatch):
    stop = threading.Event()
    server = scripted(trickle(stop))
    monkeypatch.setenv("KERAS_VIT_DOWNLOAD_DEADLINE", "2")
    url = f"{server.url}/files/model.npz"
    started = time.monotonic()
    with pytest.raises(WeightsDownloadError) as info:
        download.fetch(url, name_of(url))
    elapsed = time.monotonic() - started
    stop.set()
    partial = cache_dir() / (name_of(url) + ".incomplete")
    kept = partial.stat().st_size
    assert 1 <= kept <= 8
    assert str(info.value) == (
        f"Could not download {url} (it took longer than 2 s, the limit "
        f"KERAS_VIT_DOWNLOAD_DEADLINE sets; set it higher for a slow link; {kept:,} of "
        f"1,000 bytes are kept in {partial} and the next attempt resumes from there). "
        + hint(url))
    assert 2 <= elapsed < 2 + SAFETY / 3  # not the 500 s the file would take
    assert cache_files() == [partial.name]  # nothing at the final path


def test_503_then_200_is_retried_with_backoff_and_keeps_resuming(scripted, waits, caplog):
    data = small_checkpoint().read_bytes()
    half = len(data) // 2
    server = scripted(cut(data, half), status(503), status(502), serve(data))
    url = f"{server.url}/files/model.npz"
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        path = download.fetch(url, name_of(url))
    assert pathlib.Path(path).read_bytes() == data
    assert waits == [1.0, 2.0]
    # the retries keep the bytes received: a Range request after them
    assert server.ranges == [None, f"bytes={half}-", f"bytes={half}-", f"bytes={half}-"]
    assert server.sent[-1] == len(data) - half
    assert (f"{url} answered HTTP 503 Service Unavailable; asking again in 1 s (retry 1 of "
            "at most 4).") in caplog.text
    assert (f"{url} answered HTTP 502 Bad Gateway; asking again in 2 s (retry 2 of at most "
            "4).") in caplog.text
    assert cache.provenance(path)["sha256"] == hashlib.sha256(data).hexdigest()


def test_429_with_retry_after(scripted, waits):
    data = small_checkpoint().read_bytes()
    server = scripted(status(429, {"Retry-After": "7"}), serve(data))
    url = f"{server.url}/files/model.npz"
    assert pathlib.Path(download.fetch(url, name_of(url))).read_bytes() == data
    assert waits == [7.0]
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=30)
    assert 25 < transfer._retry_after(email.utils.format_datetime(later, usegmt=True)) <= 30
    assert transfer._retry_after("soon") is None


@pytest.mark.parametrize("case", ["retry-after too long", "past the deadline"])
def test_a_wait_that_is_too_long_gives_up_at_once(scripted, waits, monkeypatch, case):
    seconds = "3600" if case == "retry-after too long" else "5"
    monkeypatch.setenv("KERAS_VIT_DOWNLOAD_DEADLINE", "2")
    server = scripted(status(429, {"Retry-After": seconds}))
    url = f"{server.url}/files/model.npz"
    with pytest.raises(WeightsDownloadError) as info:
        download.fetch(url, name_of(url))
    why = ("the server asks to wait 3,600 s, longer than the 60 s this waits; try again later"
           if case == "retry-after too long" else
           "asking again in 5 s would pass the 2 s limit KERAS_VIT_DOWNLOAD_DEADLINE sets")
    assert str(info.value) == (
        f"Could not download {url} (HTTP 429 Too Many Requests; {why}). " + hint(url))
    assert waits == [] and len(server.requests) == 1


def test_too_many_5xx_gives_up_in_one_sentence(scripted, waits):
    server = scripted(status(503))
    url = f"{server.url}/files/model.npz"
    with pytest.raises(WeightsDownloadError) as info:
        download.fetch(url, name_of(url))
    assert str(info.value) == (
        f"Could not download {url} (HTTP 503 Service Unavailable, 5 times in a row; try "
        "again later). " + hint(url))
    assert waits == [1.0, 2.0, 4.0, 8.0] and len(server.requests) == 5
    assert cache_files() == []


def test_a_404_is_not_retried(scripted, waits):
    server = scripted(status(404))
    url = f"{server.url}/files/model.npz"
    with pytest.raises(WeightsDownloadError, match=re.escape("(HTTP 404 Not Found)")):
        download.fetch(url, name_of(url))
    assert waits == [] and len(server.requests) == 1


@pytest.mark.parametrize("variable,value,message", [
    ("KERAS_VIT_MAX_DOWNLOAD_BYTES", value,
     f"KERAS_VIT_MAX_DOWNLOAD_BYTES must be a positive whole number of bytes (e.g. "
     f"4294967296, 4 GiB), got {value!r}.") for value in ["lots", "0", "-1", "1.5", "4GiB"]
] + [
    ("KERAS_VIT_DOWNLOAD_DEADLINE", value,
     f"KERAS_VIT_DOWNLOAD_DEADLINE must be a positive number of seconds (e.g. 3600), "
     f"got {value!r}.") for value in ["soon", "0", "-5", "nan", "inf"]
])
def test_the_bounds_are_validated(monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as info:
        download.fetch("http://127.0.0.1:9/never.npz", "never.npz")
    assert str(info.value) == message


def test_a_url_without_a_host_or_a_file_name_is_said_plainly():
    """`keras-vit download http://` said "download download from that URL"."""
    code, out, err = run_cli("download", "http://")
    assert (code, out) == (2, "")
    assert err == ("keras-vit: error: The URL 'http://' names no host; give the "
                   "checkpoint's whole URL, e.g. https://HOST/PATH/FILE.npz.\n")
    hint = cache.offline_hint("https://host.example/", "entry")
    assert hint.startswith("download the file from that URL on a machine that can reach it")
    assert hint.endswith("or pass weights='/path/to/the/file'")
    assert "download model.npz from" in cache.offline_hint("https://h.example/m/model.npz",
                                                              "entry")
