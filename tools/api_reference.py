"""Builds keras_vit's API reference (HTML, with pdoc) from the docstrings,
and refuses a public name without a docstring:

    pip install "keras-vision-transformer[docs]"          # pdoc
    python tools/api_reference.py                         # writes docs/api/ (not committed)
    python tools/api_reference.py --out /tmp/api
    python tools/api_reference.py --check                 # the check alone, nothing written

Then open `docs/api/index.html`. The reference covers the public API, each
package's `__all__`: the builders and `model_from_checkpoint` (`keras_vit`),
`keras_vit.layers`, `keras_vit.weights` (`resolve`, the checkpoint
readers), `keras_vit.data` (`make_dataset`), `keras_vit.training` (`train`,
`evaluate`, the recipes), `keras_vit.export`, `keras_vit.inspect`,
`keras_vit.labels`, `keras_vit.preprocessing` and `keras_vit.errors`.

A public name is a member pdoc shows (in its module's `__all__`, else not
starting with "_"), and in a documented class each public method and
property. Functions, classes, methods and properties need a docstring (a
class its own; a method overriding a documented one reads its parent's);
constants and attributes, dataclass fields included, are described in
their module's or class's docstring. The names without one are listed and
nothing is written (exit status 1); `tests/test_api_reference.py` builds
the reference this way.
"""

import argparse
import functools
import importlib
import inspect
import os
import pathlib
import sys
import types
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "docs", "api")
# The pages: `keras_vit`'s `__all__` brings `keras_vit.layers` and `.weights`.
MODULES = ("keras_vit", "keras_vit.data", "keras_vit.training", "keras_vit.export",
           "keras_vit.inspect", "keras_vit.labels", "keras_vit.preprocessing",
           "keras_vit.errors")


def _checked(doc, owner=None):
    """Whether `doc` is a name the check asks a docstring of: a function, a
    class, a method or a property. `owner`: the class of a member."""
    import pdoc.doc

    if isinstance(doc, (pdoc.doc.Function, pdoc.doc.Class)):
        return True
    attribute = inspect.getattr_static(owner, doc.name, None) if owner else None
    return isinstance(attribute, (property, functools.cached_property))


def _documented(doc):
    """Whether pdoc's `doc` has a docstring; a class its own (not one
    inherited from a base class: `inspect.getdoc` would give ValueError's
    to an error class without one)."""
    import pdoc.doc

    if isinstance(doc, pdoc.doc.Class):
        return bool((vars(doc.obj).get("__doc__") or "").strip())
    return bool(doc.docstring.strip())


def _public(doc, module):
    """pdoc's rule (its `is_public` template macro), dunders left out."""
    if doc.name.startswith("__"):
        return False
    return doc.name in (getattr(module.obj, "__all__", None) or ()) or (
        not doc.name.startswith("_"))


def undocumented(modules):
    """The full names of the public names of `modules` (pdoc `Module`s,
    their submodules included) without a docstring, sorted."""
    import pdoc.doc

    missing, seen = set(), set()

    def visit(doc, module):
        if id(doc.obj) in seen:  # the same function or class under a second name
            return
        seen.add(id(doc.obj))
        if _checked(doc) and not _documented(doc):
            missing.add(doc.fullname)
        if not isinstance(doc, pdoc.doc.Class):
            return
        for member in doc.own_members:
            if not _public(member, module):
                continue
            if isinstance(member, pdoc.doc.Class):
                visit(member, module)
            elif _checked(member, doc.obj) and not _documented(member):
                missing.add(member.fullname)

    def walk(module):
        for doc in module.members.values():
            if not isinstance(doc, pdoc.doc.Module) and _public(doc, module):
                visit(doc, module)
        for submodule in module.submodules:
            walk(submodule)

    for module in modules:
        walk(module)
    return sorted(missing)


def _resolve_lazy(module, done):
    """Reads every name of `module.__all__` and of its subpackages': names
    loaded on first use (PEP 562, `keras_vit._lazy`) are then in the
    modules' `__dict__`, where pdoc looks them up."""
    if module.__name__ in done:
        return
    done.add(module.__name__)
    for name in getattr(module, "__all__", ()):
        value = getattr(module, name)
        if isinstance(value, types.ModuleType) and value.__name__.startswith("keras_vit."):
            _resolve_lazy(value, done)


def build(out=OUT, write=True, modules=MODULES):
    """Checks the docstrings of `modules` (names) and, with `write`, writes
    the HTML reference into `out`; returns the undocumented public names
    (nothing is written when there are any)."""
    import pdoc
    import pdoc.doc
    import pdoc.render

    import keras_vit  # loads and registers everything, quietly

    done = set()
    for name in modules:
        _resolve_lazy(importlib.import_module(name), done)
    with warnings.catch_warnings():
        # pdoc's notes on annotations it cannot evaluate (`np.ndarray` under
        # TYPE_CHECKING): the signature is shown as written
        warnings.filterwarnings("ignore", category=UserWarning, module=r"pdoc(\..*)?")
        missing = undocumented([pdoc.doc.Module.from_name(name) for name in modules])
        if missing or not write:
            return missing
        pdoc.render.configure(docformat="google", show_source=False, search=True,
                              footer_text=f"keras_vit {keras_vit.__version__}")
        os.makedirs(out, exist_ok=True)
        pdoc.pdoc(*modules, output_directory=pathlib.Path(out))
    return []


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=OUT, help=f"output folder (default {OUT})")
    parser.add_argument("--check", action="store_true",
                        help="only check that every public name has a docstring")
    args = parser.parse_args(argv)
    try:
        import pdoc  # noqa: F401
    except ImportError:
        print('api_reference: pdoc is not installed: pip install pdoc (or pip install '
              '"keras-vision-transformer[docs]").', file=sys.stderr)
        return 2
    missing = build(args.out, write=not args.check)
    if missing:
        print(f"api_reference: {len(missing)} public name(s) without a docstring:",
              file=sys.stderr)
        for name in missing:
            print(f"  {name}", file=sys.stderr)
        return 1
    if not args.check:
        print(f"API reference written to {os.path.join(args.out, 'index.html')}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
