"""Names of a package that load on first use (PEP 562)."""

import importlib
import sys


def attach(package, exports, extra=()):
    """`(__getattr__, __dir__, __all__)` for `package` (its `__name__`):
    `exports` maps each public name to the submodule that defines it, which
    is imported when the name is first read. `extra`: more names for
    `__all__` (submodules)."""
    names = sorted([*exports, *extra])

    def __getattr__(name):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__, names
