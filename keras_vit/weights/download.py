"""Downloads into the keras_vit cache that many processes, flaky links and
big files can trust.

A file is cached at `$KERAS_HOME/models/keras_vit/<name>` (see
`registry.cache_path`; a registered name has a readable `name`, a URL
`url--<digest>--<file name>`, `registry.url_cache_name`). Getting it:

1. If the cache has it, it is used at once (no lock: a file only ever
   appears there complete and verified, by an atomic rename).
2. Otherwise one process downloads it, holding the lock file
   `.locks/<name>.lock` in the cache (`cache.CacheLock`, an OS lock: the kernel
   releases it when its holder dies, so a killed download never blocks the
   next one). Other processes wait for it (a log line says so) and then read
   the finished file.
3. The bytes go to `<name>.incomplete`, which only the lock holder writes.
   A broken connection resumes with an HTTP `Range` request, in the same
   call while bytes keep coming, or in the next call (any process) where an
   interrupted or killed one stopped. A server that ignores `Range` sends
   the whole file again (`transfer`).
4. The finished file is checked: its size against the server's
   `Content-Length` / `Content-Range`, its MD5 against the `x-goog-hash`
   header where the server sends one (storage.googleapis.com does), and, for
   checkpoints, the zip CRC of every array (`npz.read_checkpoint` reads
   them all). Only then is it renamed to `<name>`, right after its
   provenance record `<name>.source.json` (`cache.provenance`: the URL the bytes
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
times in all, after 1, 2, 4, 8 s or the server's `Retry-After` (up to 60 s)
(`download_limits`, `transfer`). A progress bar, like `keras.utils.get_file`'s,
is drawn on stderr when stderr is a terminal; otherwise one log line at the
start and one at the end (`progress`).

This module imports neither Keras nor TensorFlow (checkpoints are read by
`keras_vit.weights.npz`, NumPy only), so a process that only downloads
stays light:

>>> from keras_vit.weights.download import fetch
>>> fetch("https://storage.googleapis.com/bit_models/ilsvrc2012_wordnet_lemmas.txt",
...       "labels--ilsvrc2012_wordnet_lemmas.txt")  # downloads  # doctest: +SKIP
'/home/me/.keras/models/keras_vit/labels--ilsvrc2012_wordnet_lemmas.txt'
"""

import logging
import os

from keras_vit import _atomic
from keras_vit.errors import (CorruptCheckpointError, NotAnNpzError, UnsupportedCheckpointError,
                              WeightsDownloadError)
from keras_vit.weights import registry
from keras_vit.weights.cache import (INCOMPLETE_SUFFIX, SOURCE_SUFFIX, CacheLock,
                                     discard_foreign_partial, discard_if_unchanged,
                                     download_origin, offline_hint, remove, write_provenance)
from keras_vit.weights.download_limits import Limits
from keras_vit.weights.npz import as_not_npz, read_checkpoint
from keras_vit.weights.registry import cache_path
from keras_vit.weights.transfer import IntegrityError, download_partial

logger = logging.getLogger("keras_vit")


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

    >>> fetch(url, "labels--ilsvrc2012_wordnet_lemmas.txt")  # downloads  # doctest: +SKIP
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
        except IntegrityError as error:
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

    >>> path, params = fetch_checkpoint(  # downloads
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
        source = f"downloaded from {url}"
        try:
            path, params = _fetch(url, filename, hint, verify=read)
        except (IntegrityError, CorruptCheckpointError) as error:  # a fresh download
            failure = error
        else:
            if params is not None:
                return path, params
            try:  # the cached file
                before = os.stat(path)
                source = download_origin(path)
                _check_cached_size(url, before.st_size)
                return path, read(path)
            except FileNotFoundError:  # another process discarded it meanwhile
                vanished += 1
                if vanished < 3:
                    continue
                raise
            except CorruptCheckpointError as error:
                failure = error
                discard_if_unchanged(path, before, filename)
        failures += 1
        if failures == 2:
            error_type = type(failure) if isinstance(failure, NotAnNpzError) \
                else CorruptCheckpointError
            raise error_type(
                f"The checkpoint {source} is corrupt ({failure}), "
                "twice in a row; the file was removed from the cache. Check the "
                f"URL or your mirror, or {hint}."
            ) from (failure if isinstance(failure, CorruptCheckpointError) else None)
        logger.warning(
            "The checkpoint %s (%s) failed the integrity check (%s); deleting it and "
            "downloading it again.", cache_path(filename), source, failure,
        )


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
        remove(path)
        remove(path + SOURCE_SUFFIX)
        raise UnsupportedCheckpointError(
            f"The file downloaded from {url} is not an official .npz "
            f"checkpoint (it was removed from the cache): {error}"
        ) from error


def _fetch(url, filename, hint, verify=None):
    """`(path, verify(path) or None)`: `None` when the file was in the cache
    already (the caller reads it), else the value of `verify` on the fresh
    download, checked before the rename."""
    limits = Limits(url)  # the environment checked before anything else
    final = cache_path(filename)
    if os.path.isfile(final):
        return final, None
    try:
        lock = CacheLock(filename, url)
    except OSError as error:
        raise WeightsDownloadError(
            f"Could not download {url}: the cache folder {os.path.dirname(final)} "
            f"cannot be written ({error}). Set KERAS_HOME to a writable folder, or "
            f"{hint}.") from error
    with lock:
        if os.path.isfile(final):  # another process finished it meanwhile
            return final, None
        partial = final + INCOMPLETE_SUFFIX
        discard_foreign_partial(url, partial)
        received, seconds, sha256 = download_partial(url, partial, limits, hint)
        value = None
        if verify is not None:
            try:
                value = verify(partial)
            except Exception:
                remove(partial)
                raise
        write_provenance(final, partial, url, sha256)
        _atomic.publish(partial, final)  # written whole and checked
        logger.info("Saved %s (%s bytes downloaded in %.1f s, checked).", final,
                    f"{received:,}", seconds)
        return final, value
