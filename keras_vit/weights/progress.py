"""The download progress bar, like `keras.utils.get_file`'s: drawn on
stderr when stderr is a terminal (or in a notebook), nothing otherwise
(the download then says itself in one log line at the start and one at
the end)."""

import sys
import time


class Progress:
    """A progress bar like `keras.utils.get_file`'s, on stderr, drawn only
    when stderr is a terminal (or in a notebook); it starts at the bytes
    already there."""

    WIDTH = 30

    def __init__(self, name, total, done, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = (bool(getattr(self.stream, "isatty", None) and self.stream.isatty())
                        or "ipykernel" in sys.modules)  # a notebook, as Keras' Progbar
        self.name = name if len(name) <= 40 else "…" + name[-39:]
        self.total = total
        self.start = done
        self.began = time.monotonic()
        self.last = 0.0
        self.drawn = False
        self.update(done, force=True)

    def reset(self):
        self.start = 0
        self.began = time.monotonic()

    def update(self, done, force=False):
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last < 0.1 and done != self.total:
            return
        self.last = now
        rate = (done - self.start) / max(now - self.began, 1e-6)
        unit, scale = _unit(self.total or done)
        if self.total:
            filled = int(self.WIDTH * min(done / self.total, 1.0))
            bar = "━" * filled + "─" * (self.WIDTH - filled)
            left = (self.total - done) / rate if rate > 0 else None
            text = (f"{self.name} {done / scale:.1f}/{self.total / scale:.1f} {unit} {bar} "
                    f"{100 * done / self.total:3.0f}% {rate / 2**20:.1f} MiB/s"
                    + (f" {left:.0f}s left" if left is not None and done < self.total else ""))
        else:
            text = f"{self.name} {done / scale:.1f} {unit} {rate / 2**20:.1f} MiB/s"
        self.stream.write("\r" + text + "\x1b[K")
        self.stream.flush()
        self.drawn = True

    def close(self):
        if self.enabled and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def _unit(size):
    """The unit a progress bar shows `size` bytes in."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            return unit, scale
    return "KiB", 2**10
