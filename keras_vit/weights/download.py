"""Downloads into the keras_vit cache that many processes, flaky links and
big files can trust.

A file is cached at `$KERAS_HOME/models/keras_vit/<name>` (see
`registry.cache_path`; a registered name has a readable `name`, a URL
`url--<digest>--<file name>`, `registry.url_cache_name`). Getting it:

1. If the cache has it, it is used at once (no lock: a file only ever
   appears there complete and verified, by an atomic rename).
2. Otherwise one process downloads it, holding the lock file
   `.locks/<name>.lock` in the cache (`filelock`, an OS lock: the kernel
   releases it when its holder dies, so a killed download never blocks the
   next one). Other processes wait for it (a log line says so) and then read
   the finished file.
3. The bytes go to `<name>.incomplete`, which only the lock holder writes.
   A broken connection resumes with an HTTP `Range` request, in the same
   call while bytes keep coming, or in the next call (any process) where an
   interrupted or killed one stopped. A server that ignores `Range` sends
   the whole file again.
4. The finished file is checked: its size against the server's
   `Content-Length` / `Content-Range`, its MD5 against the `x-goog-hash`
   header where the server sends one (storage.googleapis.com does), and, for
   checkpoints, the zip CRC of every array (`npz.read_checkpoint` reads
   them all). Only then is it renamed to `<name>`, right after its
   provenance record `<name>.source.json` (`provenance`: the URL the bytes
   came from, their size, SHA-256 and the date, UTC) is written, atomically
   too. Messages that name where a cached file came from read that record.

Bounds: an official file (registered, or its URL) must have the size the
official listing states (`registry.expected_size`); any download is at most
`$KERAS_VIT_MAX_DOWNLOAD_BYTES` (default 4 GiB), checked against the
announced size before writing and against the bytes while they come; the
announced size must fit the free space of the cache folder. A file refused
for its size leaves nothing behind. A connection that sends nothing for
`$KERAS_VIT_DOWNLOAD_TIMEOUT` seconds (default 60) is a stalled one; one
download may take `$KERAS_VIT_DOWNLOAD_DEADLINE` seconds (default 3600) in
all, resumes included. HTTP 5xx and 429 answers are tried again up to 5
times in all, after 1, 2, 4, 8 s or the server's `Retry-After` (up to 60 s).
A progress bar, like `keras.utils.get_file`'s,
is drawn on stderr when stderr is a terminal; otherwise one log line at the
start and one at the end.

This module imports neither Keras nor TensorFlow (checkpoints are read by
`keras_vit.weights.npz`, NumPy only), so a process that only downloads
stays light:

>>> from keras_vit.weights.download import fetch  # doctest: +SKIP
>>> fetch("https://storage.googleapis.com/bit_models/ilsvrc2012_wordnet_lemmas.txt",
...       "labels--ilsvrc2012_wordnet_lemmas.txt")  # doctest: +SKIP
'/home/me/.keras/models/keras_vit/labels--ilsvrc2012_wordnet_lemmas.txt'
"""

import base64
import binascii
import datetime
import email.utils
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import filelock

from keras_vit import _atomic, _checks
from keras_vit.errors import (CorruptCheckpointError, NotAnNpzError, UnsupportedCheckpointError,
                              WeightsDownloadError)
from keras_vit.weights import registry
from keras_vit.weights.npz import as_not_npz, read_checkpoint
# The cache location is pure Python (registry), so `keras-vit download
# --print-url` can say it without importing Keras.
from keras_vit.weights.registry import CACHE_SUBDIR, cache_path, cache_root  # noqa: F401

logger = logging.getLogger("keras_vit")

TIMEOUT_ENV = "KERAS_VIT_DOWNLOAD_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
DEADLINE_ENV = "KERAS_VIT_DOWNLOAD_DEADLINE"
DEFAULT_DEADLINE = 3600.0  # ViT-H/14 (2.46 GiB, the largest official file) at 0.7 MiB/s
MAX_BYTES_ENV = "KERAS_VIT_MAX_DOWNLOAD_BYTES"
DEFAULT_MAX_BYTES = 4 * 2**30  # above every official file (registry.EXPECTED_SIZES)
INCOMPLETE_SUFFIX = ".incomplete"
SOURCE_SUFFIX = ".source.json"
LOCKS_DIR = ".locks"
_CHUNK = 1 << 20
_WAIT_LOG_EVERY = 30.0
_ATTEMPTS = 5         # requests of a URL that answers HTTP 5xx / 429, in all
_BACKOFF = 1.0        # seconds before the second request, doubled for each next
_MAX_WAIT = 60.0      # the longest Retry-After waited for
_RECORD_LIMIT = 1 << 16  # bytes of a provenance record read at most
_sleep = time.sleep   # (tests replace it)


class _Interrupted(Exception):
    """The transfer stopped early (connection refused, broken, stalled);
    `restarted`: the partial file was emptied to start over."""

    def __init__(self, reason, restarted=False):
        super().__init__(reason)
        self.restarted = restarted


class _Refused(Exception):
    """The server answered with an HTTP error."""


class _Integrity(Exception):
    """The bytes received are not the file the server described (size or
    MD5); the partial file has been deleted."""


class _Busy(_Refused):
    """The server answered HTTP 5xx or 429 (worth asking again);
    `retry_after`: the seconds its `Retry-After` asks for, or None."""

    def __init__(self, reason, retry_after=None):
        super().__init__(reason)
        self.retry_after = retry_after


class _Late(Exception):
    """The download ran past its deadline (`$KERAS_VIT_DOWNLOAD_DEADLINE`)."""


class _Rejected(Exception):
    """The download is refused for good (its size, the free space); the
    message is the whole sentence. `keep`: the partial file stays (it is
    right, as far as it goes), else it is deleted."""

    def __init__(self, message, keep=False):
        super().__init__(message)
        self.keep = keep


def download_timeout():
    """Seconds without data after which a connection counts as stalled:
    `$KERAS_VIT_DOWNLOAD_TIMEOUT`, default 60.

    >>> os.environ["KERAS_VIT_DOWNLOAD_TIMEOUT"] = "2.5"
    >>> download_timeout()
    2.5
    >>> del os.environ["KERAS_VIT_DOWNLOAD_TIMEOUT"]

    Raises:
        ValueError: the variable is set to something other than a positive
            number of seconds.
    """
    return _seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT)


def download_deadline():
    """Seconds one download of a file may take in all (resumes and waits
    for a busy server included): `$KERAS_VIT_DOWNLOAD_DEADLINE`, default
    3600. A download stopped by it resumes in the next call.

    >>> os.environ["KERAS_VIT_DOWNLOAD_DEADLINE"] = "7200"
    >>> download_deadline()
    7200.0
    >>> del os.environ["KERAS_VIT_DOWNLOAD_DEADLINE"]

    Raises:
        ValueError: the variable is set to something other than a positive
            number of seconds.
    """
    return _seconds(DEADLINE_ENV, DEFAULT_DEADLINE)


def max_download_bytes():
    """The most bytes one download may have: `$KERAS_VIT_MAX_DOWNLOAD_BYTES`,
    default 4 GiB (4294967296, above the largest official file, ViT-H/14's
    2.46 GiB). A server that announces more is refused before anything is
    written; one that sends more without saying is stopped there.

    >>> os.environ["KERAS_VIT_MAX_DOWNLOAD_BYTES"] = "8589934592"
    >>> max_download_bytes()
    8589934592
    >>> del os.environ["KERAS_VIT_MAX_DOWNLOAD_BYTES"]

    Raises:
        ValueError: the variable is set to something other than a positive
            whole number of bytes.
    """
    return _checks.positive_env(MAX_BYTES_ENV, DEFAULT_MAX_BYTES, "bytes",
                                example=f"{DEFAULT_MAX_BYTES}, 4 GiB")


def _seconds(name, default):
    """The positive number of seconds in `$name`, `default` when unset."""
    return _checks.positive_env(name, default, "seconds", whole=False)


def check_mirror():
    """Refuses a `$KERAS_VIT_MIRROR` that is not an `http://` or
    `https://` base URL (no spaces), before anything is requested: a URL
    made from it could not be downloaded.

    >>> os.environ["KERAS_VIT_MIRROR"] = "not a url"
    >>> try:
    ...     check_mirror()
    ... except ValueError as error:
    ...     print(str(error)[:63])
    KERAS_VIT_MIRROR='not a url' is not a base URL; set it to an ht
    >>> del os.environ["KERAS_VIT_MIRROR"]

    Raises:
        ValueError: the variable is set to something else.
    """
    value = os.environ.get(registry.MIRROR_ENV)
    if value is None:
        return
    parts = urllib.parse.urlsplit(value)
    if (parts.scheme not in ("http", "https") or not parts.hostname
            or any(c.isspace() for c in value) or parts.query or parts.fragment):
        raise ValueError(
            f"{registry.MIRROR_ENV}={value!r} is not a base URL; set it to an http:// or "
            "https:// URL of a copy of the official bucket (e.g. https://my.mirror/models, "
            "serving vit_models/...), or unset it.")


# --- provenance records -------------------------------------------------------

def provenance(path):
    """The provenance record of the cache entry `path` (`<path>.source.json`,
    written with the entry): a dict with `url` (where its bytes were
    downloaded from: the mirror's URL for a `$KERAS_VIT_MIRROR` download),
    `bytes`, `sha256` and `date` (UTC). None when the entry has no record
    (copied into the cache by hand, or by a version before these records)
    or one that describes other bytes (the file was replaced since).

    >>> provenance(fetch(url, "labels--ilsvrc2012_wordnet_lemmas.txt"))  # doctest: +SKIP
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

    >>> cached_source("sam", path)  # doctest: +SKIP
    "'sam' (https://my.mirror/vit_models/sam/ViT-B_16.npz)"
    """
    record = provenance(path)
    is_url = weights.startswith(("http://", "https://"))
    if record is None:
        origin = f"{path}, {_ORIGIN_UNKNOWN}"
    elif record["url"] == weights:
        return weights
    else:
        origin = f"downloaded from {record['url']}" if is_url else record["url"]
    return f"{weights} ({origin})" if is_url else f"{weights!r} ({origin})"


def _write_provenance(final, partial, url, sha256):
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


def fetch(url, filename, hint=None):
    """Returns the local path of `url`, downloading it into
    `$KERAS_HOME/models/keras_vit/<filename>` on first use (one process at a
    time, resumable; see the module docstring). The size and the server's
    MD5 (`x-goog-hash`) are checked before the file takes its name.

    Args:
        url: an `http://` or `https://` URL.
        filename: the cache file name (`registry.url_cache_name(url)` for a
            URL of the user's, a registered name's `RemoteCheckpoint.filename`).
        hint: what to do offline, for the error message; by default where to
            copy the file by hand (`offline_hint`).

    >>> fetch(url, "labels--ilsvrc2012_wordnet_lemmas.txt")  # doctest: +SKIP
    '/home/me/.keras/models/keras_vit/labels--ilsvrc2012_wordnet_lemmas.txt'

    Raises:
        WeightsDownloadError: the download failed (offline, an HTTP error, a
            stalled or broken connection, twice a file unlike the one the
            server described) or was refused (not the official file's size,
            over `$KERAS_VIT_MAX_DOWNLOAD_BYTES` or the free space, past
            `$KERAS_VIT_DOWNLOAD_DEADLINE`), naming the URL and the bound.
        ValueError: a bad `$KERAS_VIT_DOWNLOAD_TIMEOUT`,
            `$KERAS_VIT_DOWNLOAD_DEADLINE` or `$KERAS_VIT_MAX_DOWNLOAD_BYTES`.
    """
    hint = hint or offline_hint(url, filename)
    for attempt in range(2):
        try:
            return _fetch(url, filename, hint)[0]
        except _Integrity as error:
            if attempt:
                raise WeightsDownloadError(
                    f"Could not download {url}: twice in a row, {error}; nothing was "
                    f"kept in the cache. Check the URL or your mirror, or {hint}."
                ) from None
            logger.warning("The download of %s failed its check (%s); downloading it "
                           "again.", url, error)


def fetch_checkpoint(url, filename):
    """Downloads (or reuses from the cache) an official `.npz` and reads it.

    A fresh download is read in full (zip CRC of every array) before it
    takes its name in the cache. A cached file that fails the check (bad
    zip, CRC error, truncated) is deleted and downloaded once more; a
    download that fails it, or the size / MD5 check, is downloaded once
    more too; if the second copy is corrupt as well, a
    `CorruptCheckpointError` says so. A download in another format (an HTML
    error page, a PyTorch file, ...) is deleted at once. Returns
    `(path, params)`.

    >>> path, params = fetch_checkpoint(
    ...     "https://storage.googleapis.com/vit_models/sam/ViT-B_16.npz",
    ...     "vit_models--sam--ViT-B_16.npz")  # doctest: +SKIP
    >>> params["head/bias"].shape  # doctest: +SKIP
    (1000,)

    Raises:
        WeightsDownloadError: the download failed.
        CorruptCheckpointError: corrupt twice in a row.
        UnsupportedCheckpointError: the URL serves something other than an
            official `.npz`; the message names the URL and what it served.
        ValueError: a bad `$KERAS_VIT_DOWNLOAD_TIMEOUT`,
            `$KERAS_VIT_DOWNLOAD_DEADLINE` or `$KERAS_VIT_MAX_DOWNLOAD_BYTES`.
    """
    hint = offline_hint(url, filename)

    def read(path):
        return _read_download(url, path)

    failures = vanished = 0
    while True:
        origin = f"downloaded from {url}"
        try:
            path, params = _fetch(url, filename, hint, verify=read)
        except (_Integrity, CorruptCheckpointError) as error:  # a fresh download
            failure = error
        else:
            if params is not None:
                return path, params
            try:  # the cached file
                before = os.stat(path)
                origin = _origin(path)
                _check_cached_size(url, before.st_size)
                return path, read(path)
            except FileNotFoundError:  # another process discarded it meanwhile
                vanished += 1
                if vanished < 3:
                    continue
                raise
            except CorruptCheckpointError as error:
                failure = error
                _discard(path, before, filename)
        failures += 1
        if failures == 2:
            error_type = type(failure) if isinstance(failure, NotAnNpzError) \
                else CorruptCheckpointError
            raise error_type(
                f"The checkpoint {origin} is corrupt ({failure}), "
                "twice in a row; the file was removed from the cache. Check the "
                f"URL or your mirror, or {hint}."
            ) from (failure if isinstance(failure, CorruptCheckpointError) else None)
        logger.warning(
            "The checkpoint %s (%s) failed the integrity check (%s); deleting it and "
            "downloading it again.", cache_path(filename), origin, failure,
        )


def _origin(path):
    """`downloaded from URL` of a cache entry, per its provenance record."""
    record = provenance(path)
    return f"downloaded from {record['url']}" if record else _ORIGIN_UNKNOWN


_ORIGIN_UNKNOWN = "origin unknown: no download record"


def _check_cached_size(url, size):
    """A cached official file (copied in by hand, say) of another size than
    the official listing states is corrupt: downloaded again."""
    expected = registry.expected_size(url)
    if expected is not None and not expected.allows(size):
        raise CorruptCheckpointError(
            f"it has {size:,} bytes but the official file is {expected.describe()}")


def _read_download(url, path):
    try:
        return read_checkpoint(path)
    except CorruptCheckpointError:  # NotAnNpzError included: downloaded again
        raise
    except UnsupportedCheckpointError as error:
        # judged by the URL's name: `path` may be the partial file
        not_npz = as_not_npz(error, url.split("?")[0])
        if not_npz is not error:
            raise not_npz from error
        _remove(path)
        _remove(path + SOURCE_SUFFIX)
        raise UnsupportedCheckpointError(
            f"The file downloaded from {url} is not an official .npz "
            f"checkpoint (it was removed from the cache): {error}"
        ) from error


# --- the cache entry: lock, partial file, rename ----------------------------

def _fetch(url, filename, hint, verify=None):
    """`(path, verify(path) or None)`: `None` when the file was in the cache
    already (the caller reads it), else the value of `verify` on the fresh
    download, checked before the rename."""
    limits = _Limits(url)  # the environment checked before anything else
    final = cache_path(filename)
    if os.path.isfile(final):
        return final, None
    try:
        lock = _CacheLock(filename, url)
    except OSError as error:
        raise WeightsDownloadError(
            f"Could not download {url}: the cache folder {os.path.dirname(final)} "
            f"cannot be written ({error}). Set KERAS_HOME to a writable folder, or "
            f"{hint}.") from error
    with lock:
        if os.path.isfile(final):  # another process finished it meanwhile
            return final, None
        partial = final + INCOMPLETE_SUFFIX
        _discard_foreign_partial(url, partial)
        received, seconds, sha256 = _download(url, partial, limits, hint)
        value = None
        if verify is not None:
            try:
                value = verify(partial)
            except Exception:
                _remove(partial)
                raise
        _write_provenance(final, partial, url, sha256)
        os.replace(partial, final)
        logger.info("Saved %s (%s bytes downloaded in %.1f s, checked).", final,
                    f"{received:,}", seconds)
        return final, value


def _discard_foreign_partial(url, partial):
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


def _open_partial(t, flags):
    """The partial file opened for writing (`flags`: O_APPEND or O_TRUNC),
    never through a link planted since (`O_NOFOLLOW`)."""
    try:
        fd = os.open(t.partial, os.O_WRONLY | os.O_CREAT | flags
                     | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as error:
        raise WeightsDownloadError(
            f"Could not write {t.partial} while downloading {t.url} ({error}); check "
            "that the cache folder is writable and holds no link of that name.") from error
    return open(fd, "wb")


def _discard(path, seen, filename):
    """Deletes a cached file found corrupt, unless another process has put
    a new one there since it was read (`seen`: its `os.stat` then)."""
    with _CacheLock(filename, None):
        try:
            now = os.stat(path)
        except FileNotFoundError:
            return
        if (now.st_ino, now.st_size, now.st_mtime_ns) == (
                seen.st_ino, seen.st_size, seen.st_mtime_ns):
            _remove(path)
            _remove(path + SOURCE_SUFFIX)


class _CacheLock:
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


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


# --- HTTP --------------------------------------------------------------------

_USER_AGENT = "keras-vit (python-urllib)"
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class _Limits:
    """The bounds of one file's download, read from the environment: the
    stall `timeout`, the `deadline` (seconds), the official size `expected`
    (a `registry.StatedSize`, or None) and the byte cap `cap`."""

    def __init__(self, url):
        check_mirror()
        self.timeout = download_timeout()
        self.deadline = download_deadline()
        self.cap = max_download_bytes()
        self.expected = registry.expected_size(url)

    def check_announced(self, url, size):
        """Refuses a file whose announced `size` is not the official one or
        is over the cap, before anything is written."""
        if self.expected is not None and not self.expected.allows(size):
            raise _Rejected(
                f"Could not download {url}: the server announces {size:,} bytes but the "
                f"official file is {self.expected.describe()}; nothing was kept in the "
                f"cache (check the URL or your mirror, {registry.MIRROR_ENV}).")
        if size > self.cap:
            raise _Rejected(
                f"Could not download {url}: the server announces {size:,} bytes, more "
                f"than the {self.cap:,} that {MAX_BYTES_ENV} allows (set it higher for a "
                "bigger file); nothing was kept in the cache.")

    def check_received(self, url, size):
        """Stops a download that has `size` bytes, more than it may have."""
        if self.expected is not None and size > self.expected.high:
            raise _Rejected(
                f"Could not download {url}: it sent more than {self.expected.high:,} "
                f"bytes ({size:,} so far) but the official file is "
                f"{self.expected.describe()}; stopped there, and nothing was kept in the "
                f"cache (check the URL or your mirror, {registry.MIRROR_ENV}).")
        if size > self.cap:
            raise _Rejected(
                f"Could not download {url}: it sent more than the {self.cap:,} bytes "
                f"that {MAX_BYTES_ENV} allows, without announcing its size; stopped "
                "there, and nothing was kept in the cache (set it higher for a bigger "
                "file).")

    def check_complete(self, url, size):
        """Refuses a complete download that is not the official size."""
        if self.expected is not None and not self.expected.allows(size):
            raise _Rejected(
                f"Could not download {url}: it sent {size:,} bytes but the official "
                f"file is {self.expected.describe()}; nothing was kept in the cache "
                f"(check the URL or your mirror, {registry.MIRROR_ENV}).")


class _Transfer:
    """The state of one file's download across attempts (one call)."""

    def __init__(self, url, partial, limits):
        self.url = url
        self.partial = partial
        self.limits = limits
        self.timeout = limits.timeout
        self.end = time.monotonic() + limits.deadline
        self.size = os.path.getsize(partial) if os.path.exists(partial) else 0
        self.total = None         # the file's size, once a server said it
        self.validator = None     # ETag / Last-Modified for If-Range
        self.md5 = None           # (base64 text, digest) from x-goog-hash
        self.hasher = hashlib.md5()
        self.sha256 = hashlib.sha256()  # for the provenance record
        self.progress = None
        if self.size:
            with open(partial, "rb") as f:
                for block in iter(lambda: f.read(_CHUNK), b""):
                    self.hasher.update(block)
                    self.sha256.update(block)

    def restart(self, why):
        if self.size:
            logger.info("Downloading %s from the start: %s.", self.url, why)
        with _open_partial(self, os.O_TRUNC):
            pass
        self.size = 0
        self.hasher = hashlib.md5()
        self.sha256 = hashlib.sha256()
        if self.progress is not None:
            self.progress.reset()

    def late(self):
        return time.monotonic() >= self.end


def _download(url, partial, limits, hint):
    """Downloads `url` into `partial` (resuming what is there) within
    `limits` (a `_Limits`), checks its size and MD5; returns `(bytes
    received, seconds, SHA-256 hex digest)`; raises `WeightsDownloadError`
    or `_Integrity`."""
    t = _Transfer(url, partial, limits)
    if t.size:
        logger.info("Resuming the download of %s at byte %s (%s).", url, f"{t.size:,}", partial)
    else:
        logger.info("Downloading %s", url)
    started, first = time.monotonic(), t.size
    try:
        failure = _transfer(t)
        if failure is not None:
            raise WeightsDownloadError(
                f"Could not download {url} ({failure}). If this machine is offline or "
                f"cannot reach that host, {hint}."
            )
    except _Rejected as error:
        if not error.keep:
            _remove(partial)
        raise WeightsDownloadError(str(error)) from None
    finally:
        if t.progress is not None:
            t.progress.close()
        if os.path.exists(partial) and not os.path.getsize(partial):
            _remove(partial)
    if not t.size:  # nothing to check, and nothing a checkpoint reader could name
        raise WeightsDownloadError(
            f"Could not download {url}: the server sent an empty body (0 bytes); nothing "
            f"was kept in the cache. Check the URL or your mirror ({registry.MIRROR_ENV}), "
            f"or {hint}.")
    if t.total is not None and t.size != t.total:
        _remove(partial)
        raise _Integrity(f"{t.size:,} bytes received but the server announced {t.total:,}")
    if t.md5 is not None and t.hasher.digest() != t.md5[1]:
        _remove(partial)
        got = base64.b64encode(t.hasher.digest()).decode()
        raise _Integrity(f"its MD5 is {got} but the server's x-goog-hash says md5={t.md5[0]}")
    try:
        limits.check_complete(url, t.size)
    except _Rejected as error:
        _remove(partial)
        raise WeightsDownloadError(str(error)) from None
    return t.size - first, time.monotonic() - started, t.sha256.hexdigest()


def _transfer(t):
    """Requests `t.url` until the file is complete (returns None) or fails
    (returns why): resumes while bytes keep coming (a server that starts
    over: twice at most), asks a busy server again (`_retry_wait`), all
    before `t.end`."""
    restarts = busy = 0
    while True:
        if t.late():
            return _late(t)
        before = t.size
        try:
            _attempt(t)
            return None
        except _Late:
            return _late(t)
        except _Interrupted as error:
            if t.late():  # a read that waited past the deadline
                return _late(t)
            if t.size > before or (error.restarted and restarts < 2):
                restarts += error.restarted
                if t.size > before:
                    busy = 0  # the server works again
                    logger.warning("The download of %s stopped at byte %s (%s); "
                                   "resuming.", t.url, f"{t.size:,}", error)
                continue
            return _kept(t, str(error))
        except _Busy as error:
            busy += 1
            wait, failure = _retry_wait(t, error, busy)
            if failure is not None:
                return _kept(t, failure)
            logger.warning("%s answered %s; asking again in %g s (retry %d of at most %d).",
                           t.url, error, wait, busy, _ATTEMPTS - 1)
            _sleep(wait)
        except _Refused as error:
            return _kept(t, str(error))


def _retry_wait(t, error, busy):
    """`(seconds to wait, None)` before asking a busy server again after
    its `busy`-th such answer, or `(None, why not)`: after `_ATTEMPTS`
    requests, a `Retry-After` over `_MAX_WAIT`, or a wait past the
    deadline. Waits 1, 2, 4, ... s, or what `Retry-After` says."""
    if busy >= _ATTEMPTS:
        return None, f"{error}, {busy} times in a row; try again later"
    wait = _BACKOFF * 2 ** (busy - 1)
    if error.retry_after is not None:
        if error.retry_after > _MAX_WAIT:
            return None, (f"{error}; the server asks to wait {error.retry_after:,.0f} s, "
                          f"longer than the {_MAX_WAIT:g} s this waits; try again later")
        wait = error.retry_after
    if time.monotonic() + wait >= t.end:
        return None, (f"{error}; asking again in {wait:g} s would pass the "
                      f"{t.limits.deadline:g} s limit {DEADLINE_ENV} sets")
    return wait, None


def _late(t):
    return _kept(t, f"it took longer than {t.limits.deadline:g} s, the limit "
                    f"{DEADLINE_ENV} sets; set it higher for a slow link")


def _kept(t, reason):
    """`reason`, and where the bytes received so far are kept."""
    if not t.size:
        return reason
    of = f" of {t.total:,}" if t.total else ""
    return (f"{reason}; {t.size:,}{of} bytes are kept in {t.partial} and the next "
            "attempt resumes from there")


def _attempt(t):
    """One GET (a Range GET when `t.size`), appending to the partial file."""
    headers = {"User-Agent": _USER_AGENT, "Accept-Encoding": "identity"}
    if t.size:
        headers["Range"] = f"bytes={t.size}-"
        if t.validator:
            headers["If-Range"] = t.validator
    request = urllib.request.Request(t.url, headers=headers)
    # no read waits past the deadline (nor longer than the stall timeout)
    timeout = min(t.timeout, max(t.end - time.monotonic(), 0.01))
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        error.close()
        if error.code == 416 and t.size:  # Range Not Satisfiable
            match = re.search(r"/(\d+)", error.headers.get("Content-Range", ""))
            if match and int(match.group(1)) == t.size:
                t.total = t.size  # the partial file was complete
                return
            t.restart("the partial file does not fit the file on the server")
            raise _Interrupted("the server refused to resume", restarted=True) from None
        if error.code == 429 or 500 <= error.code <= 599:
            raise _Busy(f"HTTP {error.code} {error.reason}",
                        _retry_after(error.headers.get("Retry-After"))) from None
        raise _Refused(f"HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        raise _Interrupted(_reason(error, t.timeout)) from None
    with response:
        _receive(t, response)


def _receive(t, response):
    length = response.headers.get("Content-Length")
    length = int(length) if length and length.isdigit() else None
    if response.status == 206:
        match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        if not match or int(match.group(1)) != t.size:
            t.restart(f"the server answered the Range request with "
                      f"{response.headers.get('Content-Range')!r}")
            raise _Interrupted("the server sent a different part of the file",
                               restarted=True)
        if match.group(3) != "*":
            t.total = int(match.group(3))
    else:
        if t.size:
            t.restart("the server does not resume downloads (it sent the whole file)")
        t.total = length
    announced = t.total if t.total is not None else (
        t.size + length if length is not None else None)
    if announced is not None:
        t.limits.check_announced(t.url, announced)
    _check_space(t, announced)
    t.validator = _validator(response.headers) or t.validator
    md5 = _goog_md5(response.headers)
    if md5 is not None:
        t.md5 = md5
    if t.progress is None:
        t.progress = _Progress(registry.bucket_file_name(t.url), t.total, t.size)
    else:
        t.progress.total = t.total
    with _open_partial(t, os.O_APPEND) as f:
        try:
            while True:
                try:
                    chunk = response.read1(_CHUNK)
                except (OSError, http.client.HTTPException) as error:
                    raise _Interrupted(_reason(error, t.timeout)) from None
                if not chunk:
                    break
                t.limits.check_received(t.url, t.size + len(chunk))
                try:
                    f.write(chunk)
                except OSError as error:  # a full disk, ...: no network trouble
                    raise WeightsDownloadError(
                        f"Could not write {t.partial} while downloading {t.url} "
                        f"({error}); {t.size:,} bytes are kept there and the next "
                        "attempt resumes from there.") from error
                t.hasher.update(chunk)
                t.sha256.update(chunk)
                t.size += len(chunk)
                t.progress.update(t.size)
                if t.late():
                    raise _Late()
        finally:
            f.flush()
            os.fsync(f.fileno())
    if t.total is not None and t.size < t.total:
        raise _Interrupted(
            f"the connection closed after {t.size:,} of {t.total:,} bytes")


def _check_space(t, announced):
    """Refuses to write a file whose remaining bytes (by `announced`, else
    the official size) do not fit the free space of the cache folder."""
    expected = t.limits.expected
    size = announced if announced is not None else (expected.low if expected else 0)
    needed = size - t.size
    if needed <= 0:
        return
    folder = os.path.dirname(os.path.abspath(t.partial))
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise _Rejected(_kept(t, (
            f"Could not download {t.url}: it needs {needed:,} more bytes in {folder}, "
            f"which has {free:,} bytes free; free some space, or set KERAS_HOME to a "
            "folder on a bigger disk")) + ".", keep=True)


def _retry_after(value):
    """The seconds a `Retry-After` header asks for (a number, or an HTTP
    date), or None."""
    value = (value or "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max((when - datetime.datetime.now(datetime.timezone.utc)).total_seconds(), 0.0)


def _reason(error, timeout):
    reason = getattr(error, "reason", error)
    if isinstance(reason, TimeoutError) or isinstance(error, TimeoutError):
        return (f"no data for {timeout:g} s, the limit {TIMEOUT_ENV} sets; set it "
                "higher for a slow link")
    if isinstance(error, http.client.IncompleteRead):
        return "the connection closed early"
    text = str(reason) or type(reason).__name__
    return f"{type(reason).__name__}: {text}" if isinstance(reason, Exception) else text


def _validator(headers):
    etag = headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return headers.get("Last-Modified")


def _goog_md5(headers):
    """`(base64, digest)` of the `md5=` in `x-goog-hash` headers, or None."""
    for header in headers.get_all("x-goog-hash") or []:
        for part in header.split(","):
            key, _, value = part.strip().partition("=")
            if key.lower() == "md5":
                value = value.strip()
                try:
                    return value, base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    return value, b""
    return None


class _Progress:
    """A progress bar like `keras.utils.get_file`'s, on stderr, drawn only
    when stderr is a terminal (or in a notebook); it starts at the bytes
    already there."""

    WIDTH = 30

    def __init__(self, name, total, done, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = (bool(getattr(self.stream, "isatty", None) and self.stream.isatty())
                        or "ipykernel" in sys.modules)  # a notebook, as Keras' Progbar
        self.name = name if len(name) <= 40 else "…" + name[-39:]
        self.total = total
        self.start = done
        self.began = time.monotonic()
        self.last = 0.0
        self.drawn = False
        self.update(done, force=True)

    def reset(self):
        self.start = 0
        self.began = time.monotonic()

    def update(self, done, force=False):
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last < 0.1 and done != self.total:
            return
        self.last = now
        rate = (done - self.start) / max(now - self.began, 1e-6)
        unit, scale = _unit(self.total or done)
        if self.total:
            filled = int(self.WIDTH * min(done / self.total, 1.0))
            bar = "━" * filled + "─" * (self.WIDTH - filled)
            left = (self.total - done) / rate if rate > 0 else None
            text = (f"{self.name} {done / scale:.1f}/{self.total / scale:.1f} {unit} {bar} "
                    f"{100 * done / self.total:3.0f}% {rate / 2**20:.1f} MiB/s"
                    + (f" {left:.0f}s left" if left is not None and done < self.total else ""))
        else:
            text = f"{self.name} {done / scale:.1f} {unit} {rate / 2**20:.1f} MiB/s"
        self.stream.write("\r" + text + "\x1b[K")
        self.stream.flush()
        self.drawn = True

    def close(self):
        if self.enabled and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def _unit(size):
    """The unit a progress bar shows `size` bytes in."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            return unit, scale
    return "KiB", 2**10
