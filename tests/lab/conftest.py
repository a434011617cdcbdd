"""The lab's tests (``benchmarks/experiments/``), apart from the product's: every test here is marked ``lab``, which
the default run leaves out (pyproject.toml's ``addopts``); ``python -m pytest -m lab`` runs them."""
from pathlib import Path

import pytest

LAB_TESTS = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the marks
def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.is_relative_to(LAB_TESTS):
            item.add_marker(pytest.mark.lab)
