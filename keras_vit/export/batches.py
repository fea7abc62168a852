"""How many images one run takes: the bound of a static TFLite batch (and
of `keras-vit predict --batch-size`), and running a function over images
in batches."""

import numpy as np

# The float32 RGB pixels of one batch at most: the bound of a TFLite static
# batch and of `keras-vit predict --batch-size` (445 images at 224 px).
MAX_BATCH_BYTES = 256 * 2**20


def max_batch_size(image_size):
    """The largest batch of `image_size` (height, width) float32 RGB images
    within `MAX_BATCH_BYTES` (at least 1).

    Example:

    >>> max_batch_size((224, 224)), max_batch_size((32, 32))
    (445, 21845)
    """
    height, width = image_size
    return max(1, MAX_BATCH_BYTES // (height * width * 3 * 4))


def check_batch_size(batch_size, image_size, name="batch_size"):
    """`batch_size` when it is an int in `1..max_batch_size(image_size)`;
    else a ValueError naming the value and that range (`name` is the
    argument, or a command-line flag such as `"--batch-size"`).

    Example:

    >>> check_batch_size(10**6, (224, 224))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: batch_size=1000000; allowed: 1..445 (a batch of 224x224 RGB images holds ...
    """
    limit = max_batch_size(image_size)
    if (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
            or not 1 <= batch_size <= limit):
        given = f"{name} {batch_size}" if name.startswith("--") else f"{name}={batch_size!r}"
        raise ValueError(f"{given}; allowed: 1..{limit} (a batch of {image_size[0]}x"
                         f"{image_size[1]} RGB images holds at most {MAX_BATCH_BYTES >> 20} "
                         "MiB of float32 pixels).")
    return int(batch_size)


def batched(fn, images, batch=32):
    """`fn` applied to `images` in chunks of `batch` (a positive int; one
    chunk when it exceeds the images), concatenated."""
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch={batch!r}; allowed: a positive int (images per run).")
    return np.concatenate([np.asarray(fn(images[i:i + batch]))
                           for i in range(0, len(images), batch)])
