"""Every `>>>` example in keras_vit runs: one test per module that holds
one (the same check as `python -m pytest --doctest-modules keras_vit`, run
by the suite's own `python -m pytest`).

Each example runs in its module's namespace, as `doctest.testmod` runs it,
so an example may use the module's own names and imports (`keras`, `np`);
names from elsewhere it imports itself. Examples that download, write
where a user would (`served/1`), or need what the test run lacks (a TPU,
several workers, a photo folder) are marked `# doctest: +SKIP` with the
reason beside it.
"""

import doctest
import importlib
import pathlib

import pytest
from official_fixtures import REPO_ROOT

PACKAGE = pathlib.Path(REPO_ROOT) / "keras_vit"


def _modules_with_examples():
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__main__.py" or ">>>" not in path.read_text(encoding="utf-8"):
            continue  # (importing a __main__ would run it)
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


MODULES = _modules_with_examples()


def test_the_package_has_examples():
    assert len(MODULES) >= 50, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name, tmp_path, monkeypatch):
    """The module's examples, in a temporary working folder (an example
    that writes a file writes it there)."""
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder().find(module, name, module=module)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples failed"
