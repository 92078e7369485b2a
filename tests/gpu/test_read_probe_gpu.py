"""The streaming-read probe on the H200: every copy path delivers the addressed bytes (the sink
matches the host's XOR) and streams at a plausible HBM rate."""
import pytest
import torch

from chord.lab.bench import read_probe as RP

pytestmark = pytest.mark.gpu

if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):  # pragma: no cover
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU")]


@pytest.mark.parametrize("cfg", [RP.SWEEP[0], RP.SWEEP[6], RP.SWEEP[-2]], ids=lambda c: c.label)
def test_probe_moves_the_addressed_bytes_at_a_plausible_rate(cfg):
    r = RP.measure(cfg, total_bytes=256 << 20, warmup_ms=10, rep_ms=30)  # raises if the sink is wrong
    assert r.ctas == (256 << 20) // cfg.region_bytes and r.ctas_per_sm >= 1
    assert 0.5 < r.TB_per_s < 6.0, (cfg.label, r.TB_per_s)  # H200 HBM3e peak 4.8 TB/s
