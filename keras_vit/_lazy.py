"""Names of a package that load on first use (PEP 562): the one lazy loader
of keras_vit, used by `keras_vit` itself and by `keras_vit.models`,
`keras_vit.weights` and `keras_vit.training`.

```python
# keras_vit/models/__init__.py
__getattr__, __dir__, __all__ = attach(__name__, {"ViTB16": "vit", "MLPMixer": "mixer"})
```
"""

import importlib
import sys


def attach(package, exports, extra=(), submodules=()):
    """`(__getattr__, __dir__, __all__)` for `package` (its `__name__`):
    `exports` maps each public name to the submodule that defines it (or
    to a module's full dotted name, for one outside the package), which is
    imported when the name is first read. `extra`: more names for
    `__all__` (submodules). `submodules`: submodules that load when first
    read as attributes (`keras_vit.training`), listed in `__all__` only if
    in `extra` too."""
    names = sorted([*exports, *extra])

    def __getattr__(name):  # noqa: N807  the module-level hook PEP 562 names
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = exports[name] if "." in exports[name] else f"{package}.{exports[name]}"
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():  # noqa: N807  PEP 562
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__, names
