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
import secrets


def temporary_beside(path):
    """A fresh temporary name in `path`'s folder (`.<name>.tmp-<pid>-<random>`)."""
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(directory, f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


@contextlib.contextmanager
def replacing(path, mode="w", encoding="utf-8"):
    """Opens a temporary file beside `path` for writing and, when the block
    ends without an error, renames it onto `path` (a link there is replaced,
    never followed); on an error the temporary is removed and `path` is
    unchanged."""
    temporary = temporary_beside(path)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                 0o644)
    try:
        with open(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.remove(temporary)


def write_text(path, text):
    """Writes `text` (UTF-8) to `path` atomically."""
    with replacing(path) as f:
        f.write(text)


def write_bytes(path, data):
    """Writes `data` to `path` atomically."""
    with replacing(path, "wb") as f:
        f.write(data)
