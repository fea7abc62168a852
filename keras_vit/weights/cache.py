"""The keras_vit download cache: where an entry lives, its lock, its
partial file and its provenance record.

An entry `<name>` lives at `$KERAS_HOME/models/keras_vit/<name>`
(`registry.cache_path`), with:

    <name>.incomplete     the download in progress or interrupted (only the
                          lock holder writes it; the next call resumes it)
    <name>.source.json    its provenance record (`provenance`)
    .locks/<name>.lock    its lock file (`CacheLock`: an OS lock, released by
                          the kernel when its holder dies)

A file only ever appears under `<name>` complete and verified, by an
atomic rename (`weights.download`); its record is written just before.
NumPy-free and Keras-free.
"""

import datetime
import json
import logging
import os
import stat
import time
import urllib.parse

import filelock

from keras_vit import _atomic
from keras_vit.errors import WeightsDownloadError
from keras_vit.weights import registry
# The cache location is pure Python (registry), so `keras-vit download
# --print-url` can say it without importing Keras.
from keras_vit.weights.registry import CACHE_SUBDIR, cache_path, cache_root

logger = logging.getLogger("keras_vit")

INCOMPLETE_SUFFIX = ".incomplete"
SOURCE_SUFFIX = ".source.json"
LOCKS_DIR = ".locks"
_WAIT_LOG_EVERY = 30.0
_RECORD_LIMIT = 1 << 16  # bytes of a provenance record read at most
ORIGIN_UNKNOWN = "origin unknown: no download record"


def provenance(path):
    """The provenance record of the cache entry `path` (`<path>.source.json`,
    written with the entry): a dict with `url` (where its bytes were
    downloaded from: the mirror's URL for a `$KERAS_VIT_MIRROR` download),
    `bytes`, `sha256` and `date` (UTC). None when the entry has no record
    (copied into the cache by hand, or by a version before these records)
    or one that describes other bytes (the file was replaced since).

    >>> provenance(  # downloads
    ...     fetch(url, "labels--ilsvrc2012_wordnet_lemmas.txt"))  # doctest: +SKIP
    {'url': 'https://my.mirror/bit_models/ilsvrc2012_wordnet_lemmas.txt', 'bytes': 21675,
     'sha256': '…', 'date': '2025-05-01T09:30:12Z', 'mtime_ns': …}
    """
    try:
        with open(path + SOURCE_SUFFIX, "rb") as f:
            text = f.read(_RECORD_LIMIT + 1)
        record = json.loads(text) if len(text) <= _RECORD_LIMIT else None
        now = os.stat(path)
    except (OSError, ValueError):
        return None
    if not (isinstance(record, dict) and isinstance(record.get("url"), str)
            and record.get("bytes") == now.st_size
            and record.get("mtime_ns") == now.st_mtime_ns):
        return None
    return record


def cached_source(weights, path):
    """How messages name the checkpoint `weights` (a registered name or a
    URL) cached at `path`: with the URL its bytes came from, read from the
    entry's provenance record (`provenance`), where that is not `weights`.

    >>> cached_source("sam", path)  # needs a downloaded file  # doctest: +SKIP
    "'sam' (https://my.mirror/vit_models/sam/ViT-B_16.npz)"
    """
    record = provenance(path)
    is_url = weights.startswith(("http://", "https://"))
    if record is None:
        origin = f"{path}, {ORIGIN_UNKNOWN}"
    elif record["url"] == weights:
        return weights
    else:
        origin = f"downloaded from {record['url']}" if is_url else record["url"]
    return f"{weights} ({origin})" if is_url else f"{weights!r} ({origin})"


def write_provenance(final, partial, url, sha256):
    """Writes `<final>.source.json` for the verified file `partial` (about
    to be renamed to `final`), atomically."""
    stat = os.stat(partial)
    record = {"url": url, "bytes": stat.st_size, "sha256": sha256,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "mtime_ns": stat.st_mtime_ns}
    try:  # a temporary beside it, renamed: a link planted there is never followed
        with _atomic.replacing(final + SOURCE_SUFFIX) as f:
            json.dump(record, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
    except OSError as error:  # a full disk, ...
        raise WeightsDownloadError(
            f"Could not write {final + SOURCE_SUFFIX} ({error}); the file downloaded "
            f"from {url} is kept in {partial} and the next attempt takes it from "
            "there.") from error


def lock_path(filename):
    """The lock file of the cache entry `filename`:
    `$KERAS_HOME/models/keras_vit/.locks/<filename>.lock`."""
    return os.path.join(cache_root(), CACHE_SUBDIR, LOCKS_DIR, filename + ".lock")


def offline_hint(url, filename):
    """What to do without access to `url`: the server's file name, and the
    exact cache path to copy it to (what `keras-vit download --print-url`
    prints too)."""
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    if path.rstrip("/").rsplit("/", 1)[-1]:  # the server names the file
        name = registry.bucket_file_name(url)
        what, local = name, f"/path/to/{name}"
    else:  # (bucket_file_name calls it "download": not "download download")
        what, local = "the file", "/path/to/the/file"
    return (
        f"download {what} from that URL on a machine that can reach it and copy "
        f"it to {cache_path(filename)} (where this finds it), or pass "
        f"weights='{local}'"
    )


def download_origin(path):
    """`downloaded from URL` of a cache entry, per its provenance record."""
    record = provenance(path)
    return f"downloaded from {record['url']}" if record else ORIGIN_UNKNOWN


def discard_foreign_partial(url, partial):
    """Deletes a `<name>.incomplete` that is not a partial download of this
    cache's own: a link (resuming would append the download to the file it
    points to), a FIFO, a device, a socket, or a file with another name
    elsewhere (a hard link); the download then starts over. A directory
    there is refused in one sentence (it is never deleted)."""
    try:
        found = os.lstat(partial)
    except FileNotFoundError:
        return
    mode = found.st_mode
    if stat.S_ISREG(mode) and found.st_nlink == 1:
        return
    if stat.S_ISDIR(mode):
        raise WeightsDownloadError(
            f"Could not download {url}: {partial}, where its partial download goes, is a "
            "directory; remove it and try again.")
    what = ("a link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a regular file" if stat.S_ISREG(mode)
            else "not a regular file")
    if stat.S_ISREG(mode):
        what += f" with {found.st_nlink} names (a hard link)"
    os.remove(partial)  # the name only: what it points to is untouched
    logger.warning("Discarded %s, %s and not a partial download of this cache's own; "
                   "downloading %s from the start.", partial, what, url)


def discard_if_unchanged(path, seen, filename):
    """Deletes a cached file found corrupt, unless another process has put
    a new one there since it was read (`seen`: its `os.stat` then)."""
    with CacheLock(filename, None):
        try:
            now = os.stat(path)
        except FileNotFoundError:
            return
        if (now.st_ino, now.st_size, now.st_mtime_ns) == (
                seen.st_ino, seen.st_size, seen.st_mtime_ns):
            remove(path)
            remove(path + SOURCE_SUFFIX)


class CacheLock:
    """The cache entry's lock file, held by one process (and thread) at a
    time; waiting is said in a log line, then every 30 s."""

    def __init__(self, filename, url):
        self._timeout_error = filelock.Timeout
        self.path = lock_path(filename)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.lock = filelock.FileLock(self.path)
        self.url = url
        self.filename = filename

    def __enter__(self):
        try:
            self.lock.acquire(timeout=0)
            return self
        except self._timeout_error:
            pass
        start = time.monotonic()
        logger.info(
            "Another process is downloading %s; waiting for it to finish (lock file %s).",
            self.url or cache_path(self.filename), self.path)
        while True:
            try:
                self.lock.acquire(timeout=_WAIT_LOG_EVERY)
                return self
            except self._timeout_error:
                partial = cache_path(self.filename) + INCOMPLETE_SUFFIX
                size = os.path.getsize(partial) if os.path.exists(partial) else 0
                logger.info("Still waiting for %s after %.0f s (%s bytes so far).",
                            self.path, time.monotonic() - start, f"{size:,}")

    def __exit__(self, *exc):
        self.lock.release()


def remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
