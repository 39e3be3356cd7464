"""Shared fixtures."""
import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny models: one thread avoids oversubscription on a shared CPU (files that train use
    it for every test: ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests need CUDA: without it they are skipped, with the reason shown."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run with -m gpu on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
