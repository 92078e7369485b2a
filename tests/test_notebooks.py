"""Every notebook (jupytext percent source notebooks/NN_*.py) runs top to bottom without a GPU,
in a real Jupyter kernel, with QUICK parameters; each ends with a cell asserting an invariant."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.py"))


def test_there_are_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS][:2] == ["00", "01"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(path)
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert params and "QUICK = True" in params[0].source, "a parameters cell with QUICK first"
    assert "assert" in nb.cells[-1].source, "the last cell asserts an invariant"
    # the kernel imports this checkout's chord, whatever install the environment has (as the browser test's)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                      for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "Traceback" not in outputs
    assert "\x1b" not in outputs, "terminal escape codes in a notebook's output"
    recorded = [line for line in outputs.splitlines() if line.startswith("recorded")]
    assert len(recorded) == len(set(recorded)), ("a provenance line printed twice", recorded)
    if "nothing" in outputs and "measured live" in outputs:
        assert "live run" not in outputs, "'live' said of recorded data"
