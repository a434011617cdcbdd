"""Fixtures shared by several test modules (the plain helpers they share are in ``tests/helpers.py``)."""
import pytest
import torch


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
