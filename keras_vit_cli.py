"""Launcher of the `keras-vit` command (console script `keras_vit_cli:main`).

It exists so that `keras-vit --help` does not import TensorFlow: importing
`keras_vit` registers every serializable class (layers, heads, schedules),
which imports Keras and TensorFlow. Being a top-level module, this launcher
runs before `keras_vit/__init__.py` and marks the import as the command's
(`LAZY`); the package then loads its names on first use and the commands
that need Keras call `keras_vit._load_all()`. See `keras_vit/__init__.py`.
"""

import sys

LAZY = True
# `python -m keras_vit_cli` runs this file as `__main__`: make it findable
# under its own name too, where keras_vit/__init__.py looks for it.
sys.modules.setdefault("keras_vit_cli", sys.modules[__name__])


def main(argv=None):
    from keras_vit.cli import main as _main

    return _main(argv)


if __name__ == "__main__":
    sys.exit(main())
