"""Fixtures every test folder may use."""

from __future__ import annotations

import pytest


@pytest.fixture
def one_thread():
    """torch on one thread for the test: tiny matmuls on a shared 2-core machine run fastest single-threaded,
    and the generation tests time nothing but compare paths that must agree at any thread count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
