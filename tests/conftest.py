"""Shared test fixtures: deterministic seeding and the GPU skip rule.

* Every test starts from ``torch.manual_seed(0)`` (autouse fixture ``_seed``).
* Tests marked ``@pytest.mark.gpu`` are skipped when no CUDA device is present;
  ``requires_gpu`` is the same rule as a reusable decorator (``from conftest import requires_gpu``).
* ``load_tool("host_time")`` imports ``tools/host_time.py`` (the tools are scripts, not a package)
  as a module for a CPU test of its command line (``from conftest import load_tool``).
* ``routing_check``: chord.ops' host check of device routing values switched on for one test.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

TOOLS_DIR = Path(__file__).resolve().parents[1] / "tools"

HAS_CUDA = torch.cuda.is_available()

requires_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


def load_tool(name: str):
    """tools/<name>.py, imported as the module ``<name>_tool``."""
    spec = importlib.util.spec_from_file_location(f"{name}_tool", TOOLS_DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


@pytest.fixture
def routing_check():
    """chord.ops' routing-value check switched on for the test (CHORD_CHECK_ROUTING may be off)."""
    import chord.ops

    before = chord.ops._check_routing
    chord.ops.check_routing(True)
    yield
    chord.ops.check_routing(before)


def cli_refused(argv, capsys, *named) -> None:
    """`chord <argv>` exits 2 with no traceback and its error names each of `named`."""
    from chord import cli

    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, (argv, err)
    for text in named:
        assert text in err, (text, err)
