"""Hardware ceilings measured in the same run as the kernels they judge.

* copy bandwidth: bytes read + written by a large device-to-device copy (1 GiB -> 1 GiB),
  per second (TB/s = 1e12 B/s);
* dense bf16 matmul rate: ``torch.matmul`` of two random (not zero: zeros run faster on
  Hopper) 8192 x 8192 bf16 matrices, ``2 * 8192^3`` flops per product (TFLOP/s = 1e12 flop/s).

Both are ``do_bench`` medians (``chord.lab.bench.timing``). Without a GPU, ``from_baseline_file``
gives the ceilings recorded with the committed Humming baseline (labelled as such).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from chord.lab.bench import timing

COPY_BYTES = 1 << 30
MATMUL_N = 8192


@dataclasses.dataclass(frozen=True)
class Ceilings:
    copy_TB_per_s: float
    bf16_matmul_TFLOP_per_s: float
    source: str = "measured"

    @property
    def copy_bytes_per_us(self) -> float:
        return self.copy_TB_per_s * 1e6

    @property
    def flop_per_us(self) -> float:
        return self.bf16_matmul_TFLOP_per_s * 1e6

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def measure_copy_TB_per_s(nbytes: int = COPY_BYTES) -> float:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = timing.bench(lambda: dst.copy_(src), warmup_ms=25, rep_ms=200)
    return 2 * nbytes / (t.p50 * 1e-6) / 1e12


def measure_matmul_TFLOP_per_s(n: int = MATMUL_N) -> float:
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    t = timing.bench(lambda: torch.matmul(a, b, out=out), warmup_ms=100, rep_ms=300)
    return 2 * n**3 / (t.p50 * 1e-6) / 1e12


def measure() -> Ceilings:
    """Measure both ceilings on the current CUDA device."""
    if not timing.cuda_available():
        raise RuntimeError("measuring ceilings needs a CUDA GPU")
    import torch

    name = torch.cuda.get_device_name()
    copy = measure_copy_TB_per_s()
    mm = measure_matmul_TFLOP_per_s()
    torch.cuda.empty_cache()
    return Ceilings(round(copy, 4), round(mm, 2), f"measured on {name} in this run")


def from_baseline_file(path: str | Path) -> Ceilings:
    data = json.loads(Path(path).read_text())
    c = data["ceilings"]
    return Ceilings(float(c["copy_TB_per_s"]), float(c["bf16_matmul_TFLOP_per_s"]),
                    f"recorded with the committed baseline {Path(path).name} (not measured now)")
