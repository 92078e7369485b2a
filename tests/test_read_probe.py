"""chord.lab.bench.read_probe on the host: configurations, the rendered kernel, the expected sink
(against a direct emulation of what each thread XORs), and every sweep kernel built (nvcc is a
dependency of the JIT: without it this fails, naming it)."""
import pytest
import torch

from chord.lab.bench import read_probe as RP


@pytest.mark.parametrize("kw,match", [
    (dict(mode="tma"), "mode must be one of"), (dict(mode="bulk", threads=100), "multiple of 32"),
    (dict(mode="bulk", stages=1), "at least 2"), (dict(mode="cp_async", stage_bytes=1000), "multiple of 16 x threads"),
    (dict(mode="cp_async", region_bytes=12288), "multiple of stage_bytes"),
    (dict(mode="bulk", stage_bytes=65536, stages=4), "exceed"), (dict(mode="ldg", threads=256, stages=8, region_bytes=8192 * 3),
                                                             "multiple of it"),
    (dict(mode="bulk", threads=True), "positive int")])
def test_bad_configs_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        RP.ProbeConfig(**kw)


def test_render_states_the_shared_memory_python_computed():
    src = RP.render(RP.ProbeConfig("bulk", 128, 8192, 8))
    assert "chord::ReadProbe<1, 128, 8192, 8>" in src and "kSmemBytes == 65536" in src
    assert "kSmemBytes == 0" in RP.render(RP.ProbeConfig("ldg", 256, 4096, 8))


def _emulate(src: torch.Tensor, cfg: RP.ProbeConfig) -> torch.Tensor:
    words = src.view(torch.int32).reshape(-1, cfg.region_bytes // 4).tolist()
    out = []
    for region in words:
        for t in range(cfg.threads):
            acc = 0
            if cfg.mode == "ldg":
                for v in range(t, cfg.region_bytes // 16, cfg.threads):
                    for w in region[4 * v: 4 * v + 4]:
                        acc ^= w
            else:
                for st in range(cfg.region_bytes // cfg.stage_bytes):
                    acc ^= region[st * cfg.stage_bytes // 4 + 4 * t]
            out.append(acc)
    return torch.tensor(out, dtype=torch.int32)


@pytest.mark.parametrize("cfg", [RP.ProbeConfig("cp_async", 64, 2048, 4, region_bytes=16384),
                                 RP.ProbeConfig("bulk", 32, 1024, 3, region_bytes=5120),
                                 RP.ProbeConfig("ldg", 64, 1024, 4, region_bytes=8192)], ids=lambda c: c.label)
def test_expected_sink_is_what_each_thread_xors(cfg):
    g = torch.Generator().manual_seed(3)
    src = torch.randint(-2**31, 2**31 - 1, (3 * cfg.region_bytes // 4,), dtype=torch.int32, generator=g).view(torch.uint8)
    assert torch.equal(RP.expected_sink(src, cfg), _emulate(src, cfg))


def test_xor_reduce_handles_odd_lengths():
    t = torch.tensor([[1, 2], [4, 8], [16, 32], [64, 128], [256, 512]], dtype=torch.int32)
    assert RP._xor_reduce(t, 0).tolist() == [1 ^ 4 ^ 16 ^ 64 ^ 256, 2 ^ 8 ^ 32 ^ 128 ^ 512]
    assert RP._xor_reduce(t, 1).tolist() == [3, 12, 48, 192, 768]


def test_measure_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answer on a GPU machine
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        RP.measure(RP.SWEEP[0])


def test_every_sweep_kernel_builds(tmp_path, monkeypatch):
    from chord import jit

    monkeypatch.setenv("CHORD_CACHE_DIR", str(tmp_path))
    for cfg in RP.SWEEP:
        res = jit.build(RP.render(cfg), name=f"probe-{cfg.label}")
        assert res.cubin.exists() and res.spill_bytes == 0, cfg.label
