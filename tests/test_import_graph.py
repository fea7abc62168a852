"""The floors of the house (DESIGN.md), read from the source.

Every `import` of the package, at module level or inside a function, is read
with `ast` (nothing is imported: no TensorFlow, no Keras). Each module has a
floor; a module imports only from its own floor or below, and no set of
modules imports itself around a circle. Imports between the package's own
modules sit at the top of the file; inside a function only where a module
that must load fast (the command line) puts off a heavy one.
"""

import ast
import dataclasses
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "keras_vit"

# Bottom to top. A module belongs to the floor of the longest name below that
# is itself or one of its packages.
FLOORS = [
    # `keras_vit` itself (its __init__): Python runs it before any module of
    # the package, so importing it from one loads nothing new; it imports
    # only this floor, and the public API by name on first use (`_lazy`).
    ("base", ["keras_vit", "keras_vit.variants", "keras_vit.errors", "keras_vit._checks",
              "keras_vit._compat", "keras_vit._framework_text", "keras_vit._lazy",
              "keras_vit._console",
              "keras_vit._image_files", "keras_vit._atomic", "keras_vit._plots"]),
    ("layers", ["keras_vit.layers"]),
    ("weights", ["keras_vit.weights"]),
    ("models", ["keras_vit.models", "keras_vit.preprocessing", "keras_vit.labels"]),
    ("data", ["keras_vit.data"]),
    ("applications", ["keras_vit.training", "keras_vit.export", "keras_vit.inspect",
                      "keras_vit.prediction", "keras_vit.model_arguments",
                      "keras_vit._saving"]),
    ("cli", ["keras_vit.cli", "keras_vit._cli_parser", "keras_vit.__main__"]),
]

# The only modules that import keras_vit modules inside functions, and why.
# Each import there names a module that loads one of HEAVY (checked below).
LAZY = {
    "keras_vit.cli": "`keras-vit --help` and `keras-vit models` load neither TensorFlow, "
                     "Keras nor NumPy: each command imports what it runs",
    "keras_vit.training.quickstart": "`keras_vit.training` imports the `quickstart` function "
                                     "at load (it shadows its module's name), and "
                                     "`import keras_vit` loads `keras_vit.training` "
                                     "without TensorFlow",
    "keras_vit.training.precision": "`keras_vit.cli` imports it at load (`predict`'s "
                                    "emulated-precision warning); asking where the backend "
                                    "computes loads Keras",
}
HEAVY = {"tensorflow", "keras", "numpy", "scipy", "jax", "torch"}


@dataclasses.dataclass(frozen=True)
class Import:
    source: str        # the importing module
    target: str        # a module of the package, or a third-party / stdlib top-level name
    line: int
    in_function: bool
    own: bool          # target is a module of the package

    def __str__(self):
        where = "inside a function" if self.in_function else "at module level"
        return f"{self.source} imports {self.target} (line {self.line}, {where})"


def module_files(root, package=PACKAGE):
    """{module name: path} of every module of `package` under `root`."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def _defined_names(tree):
    """Names a module defines itself at top level (not the ones it imports)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


class _Reader(ast.NodeVisitor):
    def __init__(self):
        self.found, self.depth = [], 0  # (node, in_function)

    def visit_Import(self, node):
        self.found.append((node, self.depth > 0))

    visit_ImportFrom = visit_Import  # noqa: N815  ast.NodeVisitor names

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function  # noqa: N815


def read_imports(root, package=PACKAGE):
    """`(modules, imports)`: {name: path} and every `Import` of the package."""
    modules = module_files(root, package)
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in modules.items()}
    defined = {name: _defined_names(tree) for name, tree in trees.items()}

    def resolve(name):
        """A dotted name imported from the package -> the module that defines it."""
        if name in modules:
            return name
        parent, _, attribute = name.rpartition(".")
        if parent not in modules:
            return resolve(parent) if parent else name
        if attribute in defined[parent] or not modules[parent].name == "__init__.py":
            return parent
        # A package that loads its names on first use (`_lazy.attach`):
        # the submodule that defines the name.
        owners = [m for m in modules if m.rpartition(".")[0] == parent
                  and attribute in defined[m]]
        return owners[0] if len(owners) == 1 else parent

    imports = []
    for source, tree in trees.items():
        is_package = modules[source].name == "__init__.py"
        reader = _Reader()
        reader.visit(tree)
        for node, in_function in reader.found:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = source.split(".")[: len(source.split(".")) - node.level
                                                + is_package]
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{alias.name}" for alias in node.names]
                if base.split(".")[0] != package:
                    names = [base]
            for name in names:
                own = name.split(".")[0] == package
                target = resolve(name) if own else name.split(".")[0]
                if target != source:
                    imports.append(Import(source, target, node.lineno, in_function, own))
    return modules, list(dict.fromkeys(imports))  # `from m import a, b`: one edge


def floor_of(module):
    best = None
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if module == prefix or (prefix != PACKAGE and module.startswith(prefix + ".")):
                if best is None or len(prefix) > len(best[1]):
                    best = (index, prefix)
    return None if best is None else best[0]


def upward_imports(imports):
    return [i for i in imports if i.own and floor_of(i.target) > floor_of(i.source)]


def cycles(imports):
    """The strongly connected sets of more than one module (Tarjan)."""
    graph = {}
    for i in imports:
        if i.own:
            graph.setdefault(i.source, set()).add(i.target)
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def loads_heavy(module, imports):
    """The HEAVY library `module` loads at import (through its module-level
    imports and its packages' __init__ except the root's), or None."""
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        parts = current.split(".")
        todo += [".".join(parts[:n]) for n in range(2, len(parts))]
        for i in imports:
            if i.source == current and not i.in_function:
                if not i.own and i.target in HEAVY:
                    return i.target
                if i.own:
                    todo.append(i.target)
    return None


def _has_comment(path, line):
    lines = path.read_text().splitlines()
    return "#" in lines[line - 1] or lines[line - 2].strip().startswith("#")


def lazy_import_problems(modules, imports):
    problems = []
    for i in imports:
        if not (i.own and i.in_function):
            continue
        if i.source not in LAZY:
            problems.append(f"{i}: import it at the top of the file")
        elif not loads_heavy(i.target, imports):
            problems.append(f"{i}: {i.target} loads none of {sorted(HEAVY)}; import it "
                            "at the top of the file")
        elif not _has_comment(modules[i.source], i.line):
            problems.append(f"{i}: say in a comment why it is imported there")
    return problems


# --------------------------------------------------------------- the package

@pytest.fixture(scope="module")
def graph():
    return read_imports(ROOT)


def test_every_module_has_a_floor(graph):
    modules, _ = graph
    assert [m for m in modules if floor_of(m) is None] == []


def test_no_module_imports_from_a_floor_above(graph):
    _, imports = graph
    upward = [f"{i}: floor {FLOORS[floor_of(i.source)][0]} -> {FLOORS[floor_of(i.target)][0]}"
              for i in upward_imports(imports)]
    assert not upward, "\n".join(upward)


def test_no_import_cycles(graph):
    _, imports = graph
    found = cycles(imports)
    assert not found, "\n".join(
        f"a circle through {', '.join(c)}: "
        + "; ".join(str(i) for i in imports if i.source in c and i.target in c)
        for c in found)


def test_own_modules_are_imported_inside_functions_only_to_put_off_heavy_ones(graph):
    problems = lazy_import_problems(*graph)
    assert not problems, "\n".join(problems)


def test_the_standard_library_is_imported_at_module_level(graph):
    _, imports = graph
    stdlib = [str(i) for i in imports
              if i.in_function and not i.own and i.target in sys.stdlib_module_names]
    assert not stdlib, "\n".join(stdlib)


def test_the_public_api_stays_light(graph):
    """The command line's first imports load nothing heavy."""
    _, imports = graph
    for module in ("keras_vit", "keras_vit.cli", "keras_vit.variants", "keras_vit.models",
                   "keras_vit.weights", "keras_vit.weights.registry",
                   "keras_vit.training"):
        assert loads_heavy(module, imports) is None, module


# ------------------------------------------------- the reader, on a crafted package

def _write(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_reader_finds_upward_imports_cycles_and_lazy_imports(tmp_path):
    _write(tmp_path, {
        "keras_vit/__init__.py": "",
        "keras_vit/variants.py": "import json\n",
        "keras_vit/layers/__init__.py": "from keras_vit.layers.a import A\n",
        "keras_vit/layers/a.py": "import numpy\nA = 1\n",
        "keras_vit/weights/__init__.py": "",
        "keras_vit/weights/w.py": ("from keras_vit.layers import A\n"
                                   "def f():\n    from keras_vit.models import m\n"),
        "keras_vit/models/__init__.py": "from keras_vit._lazy import attach\n",
        "keras_vit/models/m.py": "from keras_vit.weights import w\nB = 2\n",
        "keras_vit/cli.py": ("def run():\n    import os\n"
                             "    from keras_vit.models import B  # heavy\n"
                             "    from keras_vit import variants\n"),
    })
    modules, imports = read_imports(tmp_path)
    assert sorted(modules) == ["keras_vit", "keras_vit.cli", "keras_vit.layers",
                               "keras_vit.layers.a", "keras_vit.models",
                               "keras_vit.models.m", "keras_vit.variants",
                               "keras_vit.weights", "keras_vit.weights.w"]
    assert [str(i) for i in upward_imports(imports)] == [
        "keras_vit.weights.w imports keras_vit.models.m (line 3, inside a function)"]
    assert cycles(imports) == [["keras_vit.models.m", "keras_vit.weights.w"]]
    # `from keras_vit.models import B`: the lazily loaded name's own module
    assert loads_heavy("keras_vit.models.m", imports) == "numpy"
    assert sorted(lazy_import_problems(modules, imports)) == [
        "keras_vit.cli imports keras_vit.variants (line 4, inside a function): "
        "keras_vit.variants loads none of ['jax', 'keras', 'numpy', 'scipy', 'tensorflow', "
        "'torch']; import it at the top of the file",
        "keras_vit.weights.w imports keras_vit.models.m (line 3, inside a function): "
        "import it at the top of the file",
    ]
