"""Every small file the library writes goes through here: under a temporary
name beside the target, then renamed into place. A rename replaces a link
planted at the target instead of writing through it, and a kill never leaves
a partial file at the final path.

>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> target = os.path.join(folder, "labels.txt")
>>> elsewhere = os.path.join(folder, "user.txt")
>>> write_text(elsewhere, "mine\\n")
>>> os.symlink(elsewhere, target)
>>> write_text(target, "cat\\ndog\\n")
>>> open(elsewhere).read(), os.path.islink(target), open(target).read()
('mine\\n', False, 'cat\\ndog\\n')
"""

import contextlib
import os
import re
import secrets
import shutil
import socket


def host():
    """This machine's name as it appears in temporary names."""
    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:40] or "host"


def temporary_beside(path):
    """A fresh temporary name in `path`'s folder
    (`.<name>.tmp-<host>-<pid>-<random>`: an export's sweep of stale
    temporaries reads the host and process back from it)."""
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(directory,
                        f".{name}.tmp-{host()}-{os.getpid()}-{secrets.token_hex(4)}")


@contextlib.contextmanager
def renamed_into_place(path, suffix=""):
    """Yields a fresh temporary name beside `path` (ending in `suffix`, for
    a writer that wants one, e.g. Keras' `.keras`) for a writer that opens
    the file itself (`model.save`, a converter); when the block ends without
    an error, renames it onto `path`. The temporary is removed either way."""
    temporary = temporary_beside(path) + suffix
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.remove(temporary)


@contextlib.contextmanager
def replacing(path, mode="w", encoding="utf-8"):
    """Opens a temporary file beside `path` for writing and, when the block
    ends without an error, renames it onto `path` (a link there is replaced,
    never followed); on an error the temporary is removed and `path` is
    unchanged."""
    with renamed_into_place(path) as temporary:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                     | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with open(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f


def write_text(path, text):
    """Writes `text` (UTF-8) to `path` atomically."""
    with replacing(path) as f:
        f.write(text)


def write_bytes(path, data):
    """Writes `data` to `path` atomically."""
    with replacing(path, "wb") as f:
        f.write(data)


def remove_path(path):
    """Removes a file, a link or a directory tree; nothing when none is there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def publish(temporary, path):
    """Moves `temporary` (a file or a directory, written whole) to `path`,
    replacing what is there (a file or a directory, e.g. a SavedModel)
    only now."""
    path = path.rstrip("/") or path
    if os.path.isdir(path) and not os.path.islink(path) or (
            os.path.lexists(path) and os.path.isdir(temporary)):
        old = temporary_beside(path) + ".old"
        os.replace(path, old)
        os.replace(temporary, path)
        remove_path(old)
    else:
        os.replace(temporary, path)
