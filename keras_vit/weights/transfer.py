"""The HTTP transfer of one file into its partial file: resumed with
`Range` requests, within the bounds of `download_limits.Limits`, checked
against the server's size and MD5.

A broken connection resumes in the same call while bytes keep coming (a
server that ignores `Range` sends the whole file again), or in the next
call, where an interrupted or killed one stopped. HTTP 5xx and 429
answers are tried again up to 5 times in all, after 1, 2, 4, 8 s or the
server's `Retry-After` (up to 60 s). The finished bytes are checked: their
size against `Content-Length` / `Content-Range`, their MD5 against the
`x-goog-hash` header where the server sends one (storage.googleapis.com
does). The cache entry around it (lock, rename, record) is
`weights.download`'s. NumPy-free and Keras-free.
"""

import base64
import binascii
import datetime
import email.utils
import hashlib
import http.client
import logging
import os
import re
import shutil
import time
import urllib.error
import urllib.request

from keras_vit.errors import WeightsDownloadError
from keras_vit.weights import registry
from keras_vit.weights.cache import remove
from keras_vit.weights.download_limits import DEADLINE_ENV, TIMEOUT_ENV, Rejected
from keras_vit.weights.progress import Progress

logger = logging.getLogger("keras_vit")

_CHUNK = 1 << 20
_ATTEMPTS = 5         # requests of a URL that answers HTTP 5xx / 429, in all
_BACKOFF = 1.0        # seconds before the second request, doubled for each next
_MAX_WAIT = 60.0      # the longest Retry-After waited for
_sleep = time.sleep   # (tests replace it)
_USER_AGENT = "keras-vit (python-urllib)"
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class _Interrupted(Exception):
    """The transfer stopped early (connection refused, broken, stalled);
    `restarted`: the partial file was emptied to start over."""

    def __init__(self, reason, restarted=False):
        super().__init__(reason)
        self.restarted = restarted


class _Refused(Exception):
    """The server answered with an HTTP error."""


class IntegrityError(Exception):
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


def download_partial(url, partial, limits, hint):
    """Downloads `url` into `partial` (resuming what is there) within
    `limits` (a `download_limits.Limits`), checks its size and MD5; returns `(bytes
    received, seconds, SHA-256 hex digest)`; raises `WeightsDownloadError`
    or `IntegrityError`."""
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
    except Rejected as error:
        if not error.keep:
            remove(partial)
        raise WeightsDownloadError(str(error)) from None
    finally:
        if t.progress is not None:
            t.progress.close()
        if os.path.exists(partial) and not os.path.getsize(partial):
            remove(partial)
    if not t.size:  # nothing to check, and nothing a checkpoint reader could name
        raise WeightsDownloadError(
            f"Could not download {url}: the server sent an empty body (0 bytes); nothing "
            f"was kept in the cache. Check the URL or your mirror ({registry.MIRROR_ENV}), "
            f"or {hint}.")
    if t.total is not None and t.size != t.total:
        remove(partial)
        raise IntegrityError(f"{t.size:,} bytes received but the server announced {t.total:,}")
    if t.md5 is not None and t.hasher.digest() != t.md5[1]:
        remove(partial)
        got = base64.b64encode(t.hasher.digest()).decode()
        raise IntegrityError(f"its MD5 is {got} but the server's x-goog-hash says md5={t.md5[0]}")
    try:
        limits.check_complete(url, t.size)
    except Rejected as error:
        remove(partial)
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
        t.progress = Progress(registry.bucket_file_name(t.url), t.total, t.size)
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
        raise Rejected(_kept(t, (
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
