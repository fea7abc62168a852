"""An export's files: it is written under a temporary name beside its
target (`keras_vit._atomic`'s `.<name>.tmp-<host>-<pid>-<random>`) and
renamed into place (`_atomic.publish`) only once verified; the temporaries
of an export killed before its cleanup are removed by the next export to
the same target."""

import errno
import logging
import os
import re

from keras_vit import _atomic
from keras_vit._atomic import remove_path
from keras_vit._framework_text import says_disk_full

logger = logging.getLogger("keras_vit")


def _split_target(path):
    return os.path.split(os.path.abspath(path.rstrip("/") or path))


def _writer_alive(host, pid):
    """Whether the process that named a temporary may still be writing it:
    one of another machine (or of this process) is taken as alive."""
    if host != _atomic.host() or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # another user's process, or no such pid number
        return True
    return True


def directory_size(path):
    """The bytes of a file, or of the files in a directory tree: what
    removing it frees (a link counts as itself, never followed)."""
    if os.path.isdir(path) and not os.path.islink(path):
        return sum(os.lstat(os.path.join(root, f)).st_size
                   for root, _, files in os.walk(path) for f in files)
    return os.lstat(path).st_size


# `.<name>.tmp-` then this: the temporaries `temporary_path` names (and the
# `.old` / `.labels` ones made from them).
_TEMPORARY = re.compile(r"(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-[0-9a-f]{8}(\.old|\.labels)?")


def _stale_temporaries(directory, name):
    """The paths of `name`'s temporaries in `directory` whose writer is gone."""
    prefix = f".{name}.tmp-"
    try:
        entries = sorted(e for e in os.listdir(directory) if e.startswith(prefix))
    except OSError:
        return []
    stale = []
    for entry in entries:
        found = _TEMPORARY.fullmatch(entry[len(prefix):])
        if found is not None and not _writer_alive(found["host"], int(found["pid"])):
            stale.append(os.path.join(directory, entry))
    return stale


def _plural(count, one, many):
    return f"{count} {one if count == 1 else many}"


def remove_stale_temporaries(path):
    """Removes the temporaries of export target `path` that an export
    killed before its cleanup left behind, and logs one line saying how
    many and the bytes freed; returns that count.

    A temporary is `.<name>.tmp-<host>-<pid>-<random>` (or that with
    `.old` / `.labels`) beside `path`: it is stale when it was made on this
    machine by a process that is gone. Those of running processes (a
    concurrent export to the same target) and of other machines are kept.

    Example: after `kill -9` of an export to `vit.tflite`, this (or the
    next export to it) logs "Removed 1 stale temporary of /data/vit.tflite
    left by an export whose process is gone (83.1 MB freed)." and returns 1:

    >>> remove_stale_temporaries("vit.tflite")  # needs a killed export  # doctest: +SKIP
    1
    """
    directory, name = _split_target(path)
    target = os.path.join(directory, name)
    stale = _stale_temporaries(directory, name)
    removed, freed, failed = 0, 0, []
    for temporary in stale:
        try:
            size = directory_size(temporary)
            remove_path(temporary)
        except FileNotFoundError:  # removed meanwhile (another export's sweep)
            continue
        except OSError as error:
            failed.append(f"{temporary} ({error.strerror or error})")
            continue
        removed, freed = removed + 1, freed + size
    if removed:
        logger.warning("Removed %s of %s left by an export whose process is gone (%.1f MB "
                       "freed).", _plural(removed, "stale temporary", "stale temporaries"),
                       target, freed / 1e6)
    if failed:
        logger.warning("Could not remove %s of %s: %s",
                       _plural(len(failed), "stale temporary", "stale temporaries"), target,
                       ", ".join(failed))
    return removed


def temporary_path(path):
    """`.<name>.tmp-<host>-<pid>-<random>` in the directory of `path`
    (created), once the stale temporaries of `path` are removed
    (`remove_stale_temporaries`)."""
    directory, name = _split_target(path)
    os.makedirs(directory, exist_ok=True)
    remove_stale_temporaries(path)
    return _atomic.temporary_beside(os.path.join(directory, name))


def is_disk_full(error):
    """Whether `error` says the disk (or the user's quota) is full: an
    OSError with ENOSPC / EDQUOT, or a TensorFlow error saying so."""
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return says_disk_full(str(error))


def disk_full_error(error, temporary, path, what):
    """The OSError (errno ENOSPC) to raise for `error` (`is_disk_full`)
    when writing the `what` export of `path` under `temporary` ran out of
    space: one sentence naming where it was writing, that `path` is
    unchanged (the temporaries are removed) and what to do."""
    filename = getattr(error, "filename", None)
    where = os.fsdecode(filename) if filename else ""
    if not where or where.startswith(temporary):  # the temporary: its folder
        where = os.path.dirname(temporary)
    full = OSError(f"No space left on device writing in {where!r} (the {what} export to "
                   f"{path!r}); {path!r} is unchanged and the partial files are removed: "
                   "free some space and run the export again (it starts over).")
    full.errno = errno.ENOSPC
    return full


def check_replaceable_directory(path, what, marker, lacks, hint="", written=None):
    """An existing `path` is replaced only when it is an earlier export of
    its kind, a directory holding `marker` (or an empty directory) and
    nothing but `written` (the names the export writes there, when given):
    never a file, a directory of other things, or an earlier export beside
    which the user keeps files of their own (replacing the folder would
    delete them). `what`: "a SavedModel", "a Hub folder"; `lacks`: how the
    message says `marker` is missing; `hint` ends the message.

    >>> import tempfile
    >>> served = os.path.join(tempfile.mkdtemp(), "1")  # an export, and a note
    >>> os.makedirs(served)
    >>> for name in ("saved_model.pb", "NOTES.md"):
    ...     open(os.path.join(served, name), "w").close()
    >>> check_replaceable_directory(served, "a SavedModel", "saved_model.pb",
    ...     "that holds no saved_model.pb", written=("saved_model.pb", "variables"))
    Traceback (most recent call last):
    ValueError: path='.../1' holds NOTES.md, which replacing the folder would delete; ...
    >>> import shutil; shutil.rmtree(os.path.dirname(served))
    """
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path):
        raise ValueError(f"path={path!r} is a file; {what} is a directory. Give a new path "
                         "or remove the file.")
    entries = os.listdir(path)
    if entries and not os.path.exists(os.path.join(path, marker)):
        raise ValueError(f"path={path!r} is a directory {lacks}; an export replaces only an "
                         f"earlier {what.split(' ', 1)[1]}. Give a new path{hint}.")
    others = sorted(set(entries) - set(written)) if written is not None else []
    if others:  # a model card, the user's notes: never deleted unasked
        raise ValueError(
            f"path={path!r} holds {', '.join(others[:5])}"
            f"{f' and {len(others) - 5} more' if len(others) > 5 else ''}, which replacing "
            f"the folder would delete; an export replaces only {what} of the files it "
            f"writes ({', '.join(written)}). Give a new path, or move those files out.")



