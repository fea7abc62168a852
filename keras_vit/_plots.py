"""The one way keras_vit draws a PNG: matplotlib (an optional extra,
`pip install "keras-vision-transformer[plots]"`), imported on first use, its
object API only (a `Figure` of its own, drawn by the Agg canvas), so that
drawing neither switches the backend of a user's pyplot session nor leaves
a figure open there; the file is written atomically (`keras_vit._atomic`:
a link at the path is replaced, never written through).

>>> fig = figure((2, 1))
>>> _ = fig.subplots().plot([0, 1], [1, 0])
>>> save(fig, "line.png")
'line.png'
"""

import importlib
import os

from keras_vit import _atomic

# Where the plots extra is named (the one-line error of a missing library).
EXTRA = 'pip install "keras-vision-transformer[plots]"'


def require(module, what):
    """Imports `module` ("matplotlib", "sklearn"), or raises the one-line
    ImportError saying that `what` ("curves.png") needs it and which extra
    installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        package = {"sklearn": "scikit-learn"}.get(top, top)
        raise ImportError(f"{what} needs {package}: pip install {package} (or {EXTRA}).",
                          name=top) from None


def figure(size, what="The picture"):
    """A new matplotlib `Figure` of `size` inches (width, height), drawn by
    the Agg canvas; an ImportError naming the extra without matplotlib."""
    require("matplotlib", what)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig


def save(fig, path, dpi=100):
    """Writes `fig` to `path` as a PNG, atomically; returns `path`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with _atomic.renamed_into_place(path, ".png") as temporary:
        fig.savefig(temporary, dpi=dpi, format="png")
    return path
