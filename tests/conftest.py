"""Shared test fixtures: where the staged real data lives, and a small synthetic dataset."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The staged real data beside the checkout, or the folder $RECBENCH_DATA_DIR names (a worktree elsewhere).
SHARED_DATA = Path(os.environ.get("RECBENCH_DATA_DIR") or ROOT.parent / "shared" / "data")

requires_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"real data folder {SHARED_DATA} is absent")
