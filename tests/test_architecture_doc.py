"""docs/architecture.md stays true: it names every module of the package
under its package, and its table of floors is the import-graph test's.
(Nothing is imported: the files are read as text.)"""

import ast
import pathlib
import re

from test_import_graph import FLOORS

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "architecture.md").read_text()


def _section(title):
    return PAGE.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _bullets():
    """{bullet key ("base", "layers/", ...): the file names it lists}."""
    listed = {}
    for bullet in re.split(r"\n- ", "\n" + _section("Every module").strip()):
        if not bullet.strip():
            continue
        key, _, rest = bullet.partition(":")
        listed[key.strip("` ")] = set(re.findall(r"`([\w/]+\.py)`", rest))
    return listed


def test_every_module_of_the_package_is_on_the_page():
    listed = _bullets()
    top_level = set().union(*(listed[k] for k in ("base", "applications", "cli", "models/")))
    missing = []
    for path in sorted((ROOT / "keras_vit").rglob("*.py")):
        relative = path.relative_to(ROOT / "keras_vit")
        if len(relative.parts) == 1:
            name = "keras_vit/__init__.py" if relative.name == "__init__.py" else relative.name
            if name not in top_level:
                missing.append(str(relative))
        elif relative.name not in ("__init__.py", "__main__.py"):
            if relative.name not in listed.get(f"{relative.parts[0]}/", set()):
                missing.append(str(relative))
    assert not missing, f"docs/architecture.md does not name {missing}"
    named = set().union(*listed.values())
    on_disk = {p.name for p in (ROOT / "keras_vit").rglob("*.py")} | {"keras_vit/__init__.py"}
    assert named <= on_disk, f"docs/architecture.md names {sorted(named - on_disk)}, gone"


def test_the_floors_table_is_the_import_graph_tests():
    rows = re.findall(r"^\| (\w+) \| (.*?) \| .*\|$", PAGE, re.M)
    table = [(floor, set(re.findall(r"`([\w/]+)`", modules)))
             for floor, modules in rows if floor in dict(FLOORS)]
    assert [floor for floor, _ in table] == [floor for floor, _ in FLOORS]
    for (floor, shown), (_, modules) in zip(table, FLOORS, strict=True):
        expected = {m.removeprefix("keras_vit.").replace(".", "/") + (
            "/" if (ROOT / m.replace(".", "/")).is_dir() else "")
            for m in modules if m != "keras_vit"}
        assert shown == expected, f"floor {floor}: page {sorted(shown)}, test {sorted(expected)}"


def _code_lines(node, lines):
    """The non-blank, non-comment lines of a function's body, its docstring
    left out."""
    body = node.body
    if (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        body = body[1:]
    return {n for statement in body for n in range(statement.lineno, statement.end_lineno + 1)
            if lines[n - 1].strip() and not lines[n - 1].strip().startswith("#")}


def test_no_fat_module_or_function():
    """The sizes the structure issue (#47) set: no module of the package
    over 700 lines (training/ over 500), no function body over 80 lines of
    code."""
    fat = []
    for path in sorted((ROOT / "keras_vit").rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        limit = 500 if path.parent.name == "training" else 700
        if len(lines) > limit:
            fat.append(f"{path.relative_to(ROOT)}: {len(lines)} lines (at most {limit})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = len(_code_lines(node, lines))
                if count > 80:
                    fat.append(f"{path.relative_to(ROOT)}:{node.name}: {count} code lines "
                               "(at most 80)")
    assert not fat, "\n".join(fat)
