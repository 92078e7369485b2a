"""`chord doctor` on an H200: every check passes, the forward runs on Chord's kernels."""
from __future__ import annotations

import io

import pytest
import torch

from chord.lab import doctor

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]


def test_doctor_passes_every_check_on_the_h200(tmp_path, monkeypatch):
    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path / "cache"))
    out = io.StringIO()
    rc = doctor.main(out)
    text = out.getvalue()
    assert rc == 0, text
    lines = text.splitlines()[:-1]
    assert not [line for line in lines if line.startswith(("FAIL", "SKIP"))], text
    forward = next(line for line in lines if line[6:21].strip() == "forward")
    assert "Chord's kernels" in forward and "relative error" in forward
    assert "can serve" in text.splitlines()[-1]


def test_the_kernel_forward_is_compared_with_float32():
    assert doctor._forward_error("cuda") <= doctor.FORWARD_TOL
