"""The README's two newcomer commands are the ones CI and the tests run;
its generated numbers are what benchmarks/readme_numbers.py renders."""

import importlib.util
import json

import pytest
from official_fixtures import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
CI = (REPO_ROOT / ".ci" / "run").read_text()
WITHOUT_TORCH = "python -m pytest && KERAS_BACKEND=jax python -m pytest -m backends"
TEST_COMMAND = f"{WITHOUT_TORCH} && KERAS_BACKEND=torch python -m pytest -m backends"
TORCH = ('pip install "torch==2.13.0+cpu" --extra-index-url '
         "https://download.pytorch.org/whl/cpu")
TIMM = 'pip install --no-deps "timm==1.0.31"'


def test_readme_test_command_is_what_ci_runs():
    """The README's full test command is CI's; its line without PyTorch is
    that command less the PyTorch installs and the torch backend's run."""
    assert f'pip install -e ".[test]" && {TORCH} && {TIMM} && {TEST_COMMAND}' in README
    assert CI.rstrip().splitlines()[-1] == TEST_COMMAND
    assert f"python -m {TORCH}" in CI and f"python -m {TIMM}" in CI
    assert f'\npip install -e ".[test]" && {WITHOUT_TORCH}\n' in README


def test_readme_says_what_needs_the_network():
    """Only pip needs it (the package index; PyTorch's for the torch line):
    the commands are not called offline."""
    assert "from the repository root, offline" not in README
    assert ("`pip install`\nneeds the network (the package index; the PyTorch line also "
            "PyTorch's own\nindex, download.pytorch.org); everything after the installs "
            "runs offline") in README


def test_readme_main_command_is_the_quickstart():
    assert 'pip install -e ".[train]" && keras-vit quickstart' in README


def test_readme_demo_command_is_tested():
    assert "python examples/classify_photos.py" in README
    assert (REPO_ROOT / "examples" / "classify_photos.py").is_file()


def _readme_numbers_script():
    spec = importlib.util.spec_from_file_location(
        "readme_numbers", REPO_ROOT / "benchmarks" / "readme_numbers.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_readme_is_short():
    """The front page: what it is, the two commands, a tour, links to docs/."""
    assert len(README.splitlines()) <= 350


def test_readme_numbers_are_what_the_script_renders():
    """Every measured number in the generated blocks (README.md: quickstart,
    quantize, lora, parity; docs/deploy.md: the export tables) comes from
    `python benchmarks/readme_numbers.py` (docs/readme_numbers.json, with
    the date and the CPU model)."""
    script = _readme_numbers_script()
    numbers = json.loads((REPO_ROOT / "docs" / "readme_numbers.json").read_text())
    assert numbers["cpu"]["model"] and numbers["date"]
    texts = {str(page.relative_to(REPO_ROOT)): page.read_text() for page in script.PAGES}
    assert set(texts) == {"README.md", "docs/deploy.md"}
    blocks = script.render(numbers)
    assert set(blocks) == {"quickstart", "parity", "tflite_digits", "server_digits",
                           "quantize", "lora"}
    for name in ("quickstart", "parity", "quantize", "lora"):
        assert f"<!-- readme_numbers:{name} -->" in README
    assert script.rewrite_pages(blocks, texts) == texts


def test_a_block_in_no_page_or_two_is_refused():
    script = _readme_numbers_script()
    block = "<!-- readme_numbers:x -->\nold\n<!-- /readme_numbers:x -->"
    with pytest.raises(SystemExit, match=r"^<!-- readme_numbers:x --> must be in exactly one "
                                         r"of a.md, b.md; it is in 0\.$"):
        script.rewrite_pages({"x": "new"}, {"a.md": "", "b.md": ""})
    with pytest.raises(SystemExit, match="it is in 2"):
        script.rewrite_pages({"x": "new"}, {"a.md": block, "b.md": block})
