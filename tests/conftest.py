"""Fixtures shared by several test modules (the plain helpers they share are in ``tests/helpers.py``)."""
import uuid
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import OWN_MODEL, SMOKE_TOML, write_package


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread while a module runs, restored after it: small models are faster on one thread, and
    two threads crawl when another process holds a core. A module asks for it with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``, so that its module-scoped fixtures train on one
    thread too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def own(tmp_path, monkeypatch):
    """A package of the user's own outside the checkout, on sys.path, named afresh for every test (a process
    imports a module once)."""
    package = f"own_{uuid.uuid4().hex[:8]}"
    folder = write_package(tmp_path / "user", package, {"mymodel.py": OWN_MODEL, "mymodel.toml": SMOKE_TOML})
    monkeypatch.syspath_prepend(str(tmp_path / "user"))
    return SimpleNamespace(model=f"{package}.mymodel:MyRec", folder=folder, root=tmp_path / "user", package=package)
