"""Which files are images: the one list of extensions that the data
sources (`folder:DIR`) and `keras-vit predict` / `explain` share. Standard
library only, so that the command finds its images (and says which are
missing) before it imports TensorFlow.

>>> is_image_name("cat.JPG"), is_image_name("notes.txt")
(True, False)
"""

import os

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


def is_image_name(filename):
    """Whether `filename` ends with one of `IMAGE_EXTENSIONS` (any case)."""
    return filename.lower().endswith(IMAGE_EXTENSIONS)


def image_paths(inputs):
    """The image files of `inputs` (the IMAGE arguments of `keras-vit
    predict`): files as given, directories as their image files
    (recursively, sorted). A path that does not exist, or a directory
    without image files, is a ValueError naming it.

    >>> image_paths([__file__]) == [__file__]  # a file is taken as given
    True
    """
    files = []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(
                os.path.join(root, name)
                for root, dirs, names in os.walk(item)
                for name in names if is_image_name(name))
            if not found:
                raise ValueError(f"No image files ({', '.join(IMAGE_EXTENSIONS)}) under "
                                 f"{item!r}.")
            files.extend(found)
        elif os.path.exists(item):
            files.append(item)
        else:
            raise ValueError(f"Image not found: {item!r}.")
    return files
