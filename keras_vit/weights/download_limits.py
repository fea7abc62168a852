"""The bounds of one download, read from the environment (each checked
before anything is requested) and applied to what a server announces and
sends: the stall timeout, the deadline, the byte cap, the official size
(`registry.expected_size`) and the mirror (`$KERAS_VIT_MIRROR`).

| variable | bounds | default |
| --- | --- | --- |
| `$KERAS_VIT_DOWNLOAD_TIMEOUT` | seconds without data (a stalled connection) | 60 |
| `$KERAS_VIT_DOWNLOAD_DEADLINE` | seconds one download may take, resumes included | 3600 |
| `$KERAS_VIT_MAX_DOWNLOAD_BYTES` | bytes one download may have | 4 GiB |

NumPy-free and Keras-free, like the rest of the download path
(`weights.download`).
"""

import os
import urllib.parse

from keras_vit import _checks
from keras_vit.weights import registry

TIMEOUT_ENV = "KERAS_VIT_DOWNLOAD_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
DEADLINE_ENV = "KERAS_VIT_DOWNLOAD_DEADLINE"
DEFAULT_DEADLINE = 3600.0  # ViT-H/14 (2.46 GiB, the largest official file) at 0.7 MiB/s
MAX_BYTES_ENV = "KERAS_VIT_MAX_DOWNLOAD_BYTES"
DEFAULT_MAX_BYTES = 4 * 2**30  # above every official file (registry.EXPECTED_SIZES)


class Rejected(Exception):
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


class Limits:
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
            raise Rejected(
                f"Could not download {url}: the server announces {size:,} bytes but the "
                f"official file is {self.expected.describe()}; nothing was kept in the "
                f"cache (check the URL or your mirror, {registry.MIRROR_ENV}).")
        if size > self.cap:
            raise Rejected(
                f"Could not download {url}: the server announces {size:,} bytes, more "
                f"than the {self.cap:,} that {MAX_BYTES_ENV} allows (set it higher for a "
                "bigger file); nothing was kept in the cache.")

    def check_received(self, url, size):
        """Stops a download that has `size` bytes, more than it may have."""
        if self.expected is not None and size > self.expected.high:
            raise Rejected(
                f"Could not download {url}: it sent more than {self.expected.high:,} "
                f"bytes ({size:,} so far) but the official file is "
                f"{self.expected.describe()}; stopped there, and nothing was kept in the "
                f"cache (check the URL or your mirror, {registry.MIRROR_ENV}).")
        if size > self.cap:
            raise Rejected(
                f"Could not download {url}: it sent more than the {self.cap:,} bytes "
                f"that {MAX_BYTES_ENV} allows, without announcing its size; stopped "
                "there, and nothing was kept in the cache (set it higher for a bigger "
                "file).")

    def check_complete(self, url, size):
        """Refuses a complete download that is not the official size."""
        if self.expected is not None and not self.expected.allows(size):
            raise Rejected(
                f"Could not download {url}: it sent {size:,} bytes but the official "
                f"file is {self.expected.describe()}; nothing was kept in the cache "
                f"(check the URL or your mirror, {registry.MIRROR_ENV}).")
