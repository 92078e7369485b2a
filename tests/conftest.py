"""Shared test fixtures: deterministic seeding and the GPU skip rule.

* Every test starts from ``torch.manual_seed(0)`` (autouse fixture ``_seed``).
* Tests marked ``@pytest.mark.gpu`` are skipped when no CUDA device is present;
  ``requires_gpu`` is the same rule as a reusable decorator (``from conftest import requires_gpu``).
"""

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

requires_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker 'gpu')")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
