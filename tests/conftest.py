"""Shared test fixtures: where the staged real data lives, and a small synthetic dataset."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

requires_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"real data folder {SHARED_DATA} is absent")
