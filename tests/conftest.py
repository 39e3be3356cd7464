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
