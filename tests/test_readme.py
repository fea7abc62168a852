"""The README's two newcomer commands are the ones CI and the tests run."""

from official_fixtures import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
CI = (REPO_ROOT / ".ci" / "run").read_text()
TEST_COMMAND = "python -m pytest && KERAS_BACKEND=jax python -m pytest -m backends"


def test_readme_test_command_is_what_ci_runs():
    assert TEST_COMMAND in README
    assert CI.rstrip().splitlines()[-1] == TEST_COMMAND


def test_readme_main_command_is_the_quickstart():
    assert 'pip install -e ".[train]" && keras-vit quickstart' in README


def test_readme_demo_command_is_tested():
    assert "python examples/classify_photos.py" in README
    assert (REPO_ROOT / "examples" / "classify_photos.py").is_file()
