"""The README's two newcomer commands are the ones CI and the tests run."""

from official_fixtures import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
CI = (REPO_ROOT / ".ci" / "run").read_text()
TEST_COMMAND = ("python -m pytest && KERAS_BACKEND=jax python -m pytest -m backends && "
                "KERAS_BACKEND=torch python -m pytest -m backends")
TORCH = ('pip install "torch==2.13.0+cpu" --extra-index-url '
         "https://download.pytorch.org/whl/cpu")


def test_readme_test_command_is_what_ci_runs():
    assert f'pip install -e ".[test]" && {TORCH} && {TEST_COMMAND}' in README
    assert CI.rstrip().splitlines()[-1] == TEST_COMMAND
    assert f"python -m {TORCH}" in CI


def test_readme_main_command_is_the_quickstart():
    assert 'pip install -e ".[train]" && keras-vit quickstart' in README


def test_readme_demo_command_is_tested():
    assert "python examples/classify_photos.py" in README
    assert (REPO_ROOT / "examples" / "classify_photos.py").is_file()


def test_readme_numbers_are_what_the_script_renders():
    """Every measured number in the README's generated blocks comes from
    `python benchmarks/readme_numbers.py` (docs/readme_numbers.json, with
    the date and the CPU model)."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location(
        "readme_numbers", REPO_ROOT / "benchmarks" / "readme_numbers.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    numbers = json.loads((REPO_ROOT / "docs" / "readme_numbers.json").read_text())
    assert numbers["cpu"]["model"] and numbers["date"]
    assert script.rewrite_readme(script.render(numbers), README) == README
