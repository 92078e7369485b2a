"""Kernel timing: ``triton.testing.do_bench`` medians (with p20 / p80), and the L2 policy.

``bench(fn)`` times ``fn`` (a closure that launches the kernels under test, nothing else) the way
the project fixes for every measurement: ``triton.testing.do_bench(fn, warmup=50 ms, rep=300 ms,
quantiles=[0.2, 0.5, 0.8])``, returned in microseconds.

Kernels only: with ``graph=True`` (what ``chord bench`` and the Humming baseline use by
default) ``fn`` is captured once into a CUDA graph and ``do_bench`` times its replay. Timed
eagerly, a Python wrapper whose host time exceeds its kernel's (both Chord's and Humming's at
TP8 / 1 token: ~15 us kernels) leaves the GPU idle between gate_up and down and the number
measures the host, not the kernels (Humming at tp8-m1: 67 us eager vs ~25 us of kernels on the
H200 machine of 2026-11-29). vLLM runs decode under CUDA graphs too.

L2 residency (H200: 60 MB of L2). ``do_bench`` zeroes a 256 MB buffer before *every* timed call,
which evicts everything the previous call left in L2, so each call streams its weights from
HBM. That matters for TP8 at small M: one token touches 8 experts = 24.8 MB of INT4 weights and
scales, which would otherwise stay L2-resident across repetitions and make the kernel look
faster than the memory floor allows. The EP8 weights (1.19 GB) are far larger than L2 anyway.
We rely on that flush instead of rotating weight copies (rotation would need several 1.2 GB
copies and changes nothing the flush does not already guarantee). Known bias: the flush leaves
up to ~60 MB of *dirty* lines in L2; a kernel that reads little data pays for part of their
write-back. That bias is the same for Chord and Humming (both are timed this way), and it is
why sub-30-µs scenarios report a lower percentage of their floor than kernel-only profiles do.

Without triton (CPU-only machines) ``bench`` refuses; ``bench_events`` is the same protocol
written with CUDA events (also flushes L2 with a 256 MB buffer), kept for machines with CUDA
but without triton.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Callable

WARMUP_MS = 50
REP_MS = 300
QUANTILES = (0.2, 0.5, 0.8)
_FLUSH_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Timing:
    """Quantiles of one measurement, microseconds."""

    p20: float
    p50: float
    p80: float
    method: str = "triton.testing.do_bench"

    def as_dict(self) -> dict:
        return {"p20": self.p20, "p50": self.p50, "p80": self.p80}


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)
    except Exception:  # pragma: no cover - broken torch installs
        return False


def capture_graph(fn: Callable[[], object]):
    """``fn`` recorded into a ``torch.cuda.CUDAGraph`` (warmed up once on a side stream first)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def bench(fn: Callable[[], object], *, warmup_ms: float = WARMUP_MS, rep_ms: float = REP_MS,
          graph: bool = False) -> Timing:
    """``do_bench`` p20 / p50 / p80 of ``fn`` in microseconds (L2 flushed before every call).

    ``graph=True`` captures ``fn`` into a CUDA graph and times its replay: the kernels alone,
    back to back, without the Python / dispatch time between launches (what vLLM's CUDA-graph
    decode sees). If capture fails, ``fn`` is timed eagerly and ``method`` says why.
    """
    if graph:
        try:
            g = capture_graph(fn)
        except Exception as exc:  # e.g. an op that syncs with the host
            t = bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms)
            return dataclasses.replace(t, method=f"{t.method} eager (CUDA graph capture failed: "
                                                 f"{type(exc).__name__}: {exc})"[:300])
        t = bench(g.replay, warmup_ms=warmup_ms, rep_ms=rep_ms)
        del g
        return dataclasses.replace(t, method=f"{t.method} of a CUDA graph replay")
    try:
        from triton.testing import do_bench
    except ImportError:
        return bench_events(fn, warmup_ms=warmup_ms, rep_ms=rep_ms)
    q = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=list(QUANTILES))
    p20, p50, p80 = (float(v) * 1e3 for v in q)
    return Timing(p20, p50, p80)


def _quantile(sorted_vals: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, what triton uses)."""
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = q * (len(sorted_vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def bench_events(fn: Callable[[], object], *, warmup_ms: float = WARMUP_MS, rep_ms: float = REP_MS) -> Timing:
    """``do_bench``'s protocol with plain CUDA events (for CUDA machines without triton)."""
    import torch

    if not cuda_available():
        raise RuntimeError("timing needs a CUDA GPU (no CUDA device is visible)")
    cache = torch.empty(_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        cache.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    n_warm, n_rep = max(1, int(warmup_ms / est)), max(1, int(rep_ms / est))
    for _ in range(n_warm):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for i in range(n_rep):
        cache.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
    return Timing(_quantile(times, 0.2), statistics.median(times), _quantile(times, 0.8), "cuda events (do_bench protocol)")


@dataclasses.dataclass(frozen=True)
class HostTime:
    """Host time of one call (CPU side, warm caches), in microseconds."""

    median_us: float
    p90_us: float
    calls: int


def host_time(fn: Callable[[], object], *, calls: int = 2000, warmup: int = 50, keep_ahead: bool = True) -> HostTime:
    """time.perf_counter around each of `calls` calls of `fn`, one at a time: the launches are
    asynchronous, so this is the host's share of a call (argument handling, schedule lookup and
    the driver's launch). With `keep_ahead` the GPU is kept ahead of the host with a sleep kernel
    every 200 calls, so no call waits for a full launch queue (`fn` must then not synchronize with
    the GPU); without it, for a call that reads device values and so waits for the GPU anyway."""
    import time

    import torch

    for name, v in (("calls", calls), ("warmup", warmup)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "calls" else 0):
            raise ValueError(f"host_time: {name} must be an int >= {1 if name == 'calls' else 0}, got {v!r}")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for i in range(calls):
        if keep_ahead and i % 200 == 0:
            torch.cuda.synchronize()
            torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time ahead of the host
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    ts.sort()
    return HostTime(statistics.median(ts), _quantile(ts, 0.9), calls)
