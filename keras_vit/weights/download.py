"""Downloads into the Keras cache (`keras.utils.get_file`, progress bar),
with an integrity check and one retry for corrupt cached files."""

import logging
import os

from keras_vit.weights.official import (
    CorruptCheckpointError,
    UnsupportedCheckpointError,
    read_checkpoint,
)
# The cache location is pure Python (registry), so `keras-vit download
# --print-url` can say it without importing Keras.
from keras_vit.weights.registry import CACHE_SUBDIR, cache_path, cache_root  # noqa: F401

logger = logging.getLogger("keras_vit")


class WeightsDownloadError(OSError):
    """A file could not be downloaded (offline, HTTP error, bad mirror)."""


def fetch(url, filename, hint=None):
    """Returns the local path of `url`, downloading it into
    `$KERAS_HOME/models/keras_vit/<filename>` on first use.

    Raises:
        WeightsDownloadError: naming the URL and what to do offline.
    """
    import keras

    try:
        return keras.utils.get_file(
            fname=filename, origin=url, cache_subdir=CACHE_SUBDIR,
            cache_dir=cache_root(),
        )
    except Exception as error:  # get_file raises a bare Exception
        hint = hint or "download it elsewhere and pass its local path"
        raise WeightsDownloadError(
            f"Could not download {url} ({error}). If this machine is offline "
            f"or cannot reach that host, {hint}."
        ) from error


def fetch_checkpoint(url, filename):
    """Downloads (or reuses from the cache) an official `.npz` and reads it.

    A cached file that fails the integrity check (bad zip, CRC error,
    truncated) is deleted and downloaded once more; if the new copy is
    corrupt too, it is deleted as well and a `CorruptCheckpointError` says
    so. A download in another format (an HTML error page, a PyTorch file,
    ...) is deleted from the cache at once. Returns `(path, params)`.

    Raises:
        WeightsDownloadError: the download failed.
        CorruptCheckpointError: corrupt twice in a row.
        UnsupportedCheckpointError: the URL serves something other than an
            official `.npz`; the message names the URL and what it served.
    """
    hint = f"download it elsewhere and pass weights='/path/to/{filename}'"
    path = fetch(url, filename, hint)
    try:
        return path, _read_download(url, path)
    except CorruptCheckpointError as error:
        logger.warning(
            "Cached checkpoint %s failed the integrity check (%s); deleting "
            "it and downloading it again.", path, error,
        )
        os.remove(path)
    path = fetch(url, filename, hint)
    try:
        return path, _read_download(url, path)
    except CorruptCheckpointError as error:
        os.remove(path)
        raise CorruptCheckpointError(
            f"The checkpoint downloaded from {url} is corrupt ({error}), "
            "twice in a row; the file was removed from the cache. Check the "
            f"URL or your mirror, or {hint}."
        ) from error


def _read_download(url, path):
    try:
        return read_checkpoint(path)
    except UnsupportedCheckpointError as error:
        os.remove(path)
        raise UnsupportedCheckpointError(
            f"The file downloaded from {url} is not an official .npz "
            f"checkpoint (it was removed from the cache): {error}"
        ) from error
