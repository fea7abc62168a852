"""Which files are images: the one list of extensions that the data
sources (`folder:DIR`) and `keras-vit predict` / `explain` share, the one
list of image types they leave out (with one wording, counted), and the
one rule for what can be read (a regular file: never a FIFO, a device or a
directory). Standard library only, so that the command finds its images
(and says which are missing) before it imports TensorFlow.

>>> is_image_name("cat.JPG"), is_image_name("notes.txt"), is_image_name("cat.webp")
(True, False, False)
>>> other_image_type("cat.webp"), other_image_type("notes.txt")
('.webp', None)
"""

import errno
import os
import stat

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
# Image types keras_vit does not read: TensorFlow cannot decode TIFF, HEIF,
# AVIF or JPEG 2000, and a WebP file's header is not read for its size, so
# that its pixels could not be bounded before decoding (KERAS_VIT_MAX_IMAGE_PIXELS).
OTHER_IMAGE_EXTENSIONS = (".webp", ".tif", ".tiff", ".heic", ".heif", ".avif", ".jp2",
                          ".jxl")


def is_image_name(filename):
    """Whether `filename` ends with one of `IMAGE_EXTENSIONS` (any case)."""
    return filename.lower().endswith(IMAGE_EXTENSIONS)


def other_image_type(filename):
    """The extension (lower case) of `filename` when it names an image type
    keras_vit does not read (`OTHER_IMAGE_EXTENSIONS`), else None."""
    extension = os.path.splitext(filename)[1].lower()
    return extension if extension in OTHER_IMAGE_EXTENSIONS else None


def left_out_sentence(where, names):
    """The one wording of the image files of types keras_vit does not read
    that were left out of `where` (a folder), or None when there are none:
    counted, their types named, the types read and what to do."""
    types = sorted({other_image_type(name) for name in names} - {None})
    count = sum(other_image_type(name) is not None for name in names)
    if not count:
        return None
    files = "image file" if count == 1 else "image files"
    return (f"{where}: left out {count} {files} of a type keras_vit does not read "
            f"({', '.join(types)}); it reads {', '.join(IMAGE_EXTENSIONS)}: convert "
            f"{'it' if count == 1 else 'them'} (e.g. to PNG) to include "
            f"{'it' if count == 1 else 'them'}.")


def unreadable_reason(path):
    """Why the local `path` cannot be read as an image file (one stat and one
    access check, no read: a FIFO named `x.jpg` would block a read for
    ever, a device such as /dev/zero never ends), or None for a readable
    regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "a symbolic link loop"
        if error.errno == errno.ENOENT and os.path.islink(path):
            return f"a symbolic link to {os.readlink(path)!r}, which does not exist"
        return error.strerror or str(error)
    return mode_problem(mode) or (None if os.access(path, os.R_OK)
                                  else "no permission to read it")


def mode_problem(mode):
    """Why a file of `st_mode` `mode` is not read as an image (a directory;
    a FIFO, a device or a socket: "not a regular file"), or None for a
    regular file."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    return None


def read_image_file(path):
    """The bytes of the regular file `path`: opened without blocking and
    checked (`fstat`) before any read, so that a FIFO, a device or a
    directory (or a file swapped for one after a check) is an OSError whose
    `strerror` says what it is, never a read that hangs or never ends."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        problem = mode_problem(os.fstat(fd).st_mode)
        if problem:
            raise OSError(errno.EINVAL, problem, path)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = None
            return f.read()
    finally:
        if fd is not None:
            os.close(fd)


def image_paths(inputs):
    """The image files of `inputs` (the IMAGE arguments of `keras-vit
    predict`): files as given, directories as their image files
    (recursively, sorted). A path that does not exist, or a directory
    without image files, is a ValueError naming it.

    >>> image_paths([__file__]) == [__file__]  # a file is taken as given
    True
    >>> image_paths(["cat.webp"])  # but never a type keras_vit does not read
    Traceback (most recent call last):
    ValueError: 'cat.webp' is a .webp file, an image type keras_vit does not read (it ...
    """
    return image_paths_and_left_out(inputs)[0]


def image_paths_and_left_out(inputs):
    """`(image_paths(inputs), sentences)`: `sentences` says, per directory,
    how many image files of a type keras_vit does not read were left out
    (`left_out_sentence`). A file given by name of such a type is a
    ValueError naming it (a file of another name is taken as given: its
    bytes must be one of the types read, `keras-vit predict` checks)."""
    files, sentences = [], []
    for item in inputs:
        if os.path.isdir(item):
            found, others = [], []
            for root, _, names in os.walk(item):
                for name in names:
                    (found if is_image_name(name) else others).append(os.path.join(root, name))
            left_out = left_out_sentence(item, others)
            if not found:
                raise ValueError(f"No image files ({', '.join(IMAGE_EXTENSIONS)}) under "
                                 f"{item!r}" + (f"; {left_out[len(item) + 2:]}"
                                                if left_out else "."))
            files.extend(sorted(found))
            if left_out:
                sentences.append(left_out)
        elif other_image_type(item):
            raise ValueError(
                f"{item!r} is a {other_image_type(item)} file, an image type keras_vit does "
                f"not read (it reads {', '.join(IMAGE_EXTENSIONS)}); convert it (e.g. to "
                "PNG).")
        elif os.path.lexists(item):
            if item.endswith(".keras"):  # `predict model.keras image.png` (evaluate's order)
                raise ValueError(f"{item!r} is a Keras model file, not an image: give it "
                                 f"as --model {item}.")
            files.append(item)  # any other name: its bytes must be one of those types
        else:
            raise ValueError(f"Image not found: {item!r}.")
    return files, sentences
