"""A distributed MoE layer over ``torch.distributed``: expert parallel (EP) or tensor parallel (TP).

The harness runs one scaled-down Kimi-shaped MoE layer (E experts, hidden H, intermediate I,
top-k routing, INT4 group-32 weights with bf16 scales) on ``world`` processes and checks every
rank's output against a float32 reference of the whole E-expert layer computed on that rank
(``chord.reference.moe_ref``). Each GEMM goes through the ``humming`` root exactly as vLLM 0.33
calls it (load path: ``chord.lab.bench.vllm_sequence.build_layer``; per forward:
``humming_forward`` for w13, ``may_process_input`` with SiLU and mul, ``humming_forward`` for w2).

Weights and router are made from ``--seed`` on every rank (the same on all of them, so nothing is
broadcast); each rank then keeps its share.

EP: rank r owns experts ``[r*E/world, (r+1)*E/world)``. Every rank has its own tokens (seed +
rank), routes them over all E experts, and sends each routed row (with its local expert id) to the
owner with ``all_to_all_single``. The owner groups the rows it received by local expert and runs
the grouped families -- ``grouped_contiguous`` (vLLM's unaligned int64 offsets) for prefill-sized
batches, ``grouped_masked`` (``[E_local, max_rows, H]`` with int32 counts) for decode-sized ones,
as vLLM's EP experts classes do; ``--family auto`` takes masked up to ``MASKED_MAX_TOKENS`` tokens
per rank. The outputs go back by ``all_to_all_single`` and each token's rows are summed with their
router weights.

TP: every rank has the same tokens and routing and holds 1/world of every expert's intermediate
dimension (its gate and up rows of w13, the matching K columns of w2); it runs the ``indexed``
family (vLLM's TP experts class) and the weighted partial outputs are summed with ``all_reduce``.

Phases are timed per rank (CUDA events on a GPU, ``time.perf_counter`` on the CPU): ``dispatch``
(EP: routing metadata, counts and row ``all_to_all``), ``gemms`` (layout, gate_up, activation,
down), ``combine`` (EP: rows back and the weighted sum; TP: the weighted sum and ``all_reduce``).

Launch: ``world`` processes are spawned with ``torch.multiprocessing`` (or, under ``torchrun``,
RANK / WORLD_SIZE / LOCAL_RANK are read and nothing is spawned). With CUDA each rank takes one
GPU and NCCL; without, gloo and the float32 reference behind the ``humming`` root
(``humming._chord.cpu_reference_backend``), so the distributed code runs in CI. NVLink
multicast is kept off in every process (``MULTICAST_OFF``): the 8-GPU hosts this harness is for
must run without it, and NCCL / torch symmetric memory / NVSHMEM read these at initialisation.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from chord.lab import _args

#: set in the parent before any process starts (and again in each rank, for torchrun): NVLink
#: multicast (NVLS) off for NCCL, torch symmetric memory and NVSHMEM
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MODES = ("ep", "tp")
FAMILIES = ("auto", "grouped_contiguous", "grouped_masked", "indexed")
EP_FAMILIES = ("grouped_contiguous", "grouped_masked")
#: --family auto in EP: grouped_masked up to this many tokens per rank (decode), contiguous above
MASKED_MAX_TOKENS = 64
GROUP = 32  # INT4 scale group along K
PHASES = ("dispatch", "gemms", "combine")


@dataclasses.dataclass(frozen=True)
class Config:
    mode: str = "ep"
    world_size: int = 2
    tokens: int = 32  # per rank
    experts: int = 16
    hidden: int = 256
    intermediate: int = 128
    top_k: int = 4
    seed: int = 0
    family: str = "auto"
    iters: int = 3
    device: str = "auto"  # auto | cpu | cuda

    def gemm_family(self) -> str:
        if self.family != "auto":
            return self.family
        if self.mode == "tp":
            return "indexed"
        return "grouped_masked" if self.tokens <= MASKED_MAX_TOKENS else "grouped_contiguous"


def check_config(cfg: Config) -> Config:
    """Refuses (UsageError naming the flag) what the layer cannot split, before any process starts."""
    _args.check_choice("--mode", cfg.mode, MODES)
    _args.check_choice("--family", cfg.family, FAMILIES)
    _args.check_choice("--device", cfg.device, ("auto", "cpu", "cuda"))
    for flag, v in (("--world-size", cfg.world_size), ("--tokens", cfg.tokens), ("--experts", cfg.experts),
                    ("--hidden", cfg.hidden), ("--intermediate", cfg.intermediate), ("--top-k", cfg.top_k),
                    ("--iters", cfg.iters)):
        _args.check_positive_int(flag, v)
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise _args.UsageError(f"--seed must be a non-negative integer, got {cfg.seed!r}")
    if cfg.top_k > cfg.experts:
        raise _args.UsageError(f"--top-k {cfg.top_k} exceeds --experts {cfg.experts}")
    if cfg.hidden % GROUP:
        raise _args.UsageError(f"--hidden {cfg.hidden} must be a multiple of {GROUP} (the INT4 scale group)")
    if cfg.intermediate % GROUP:
        raise _args.UsageError(f"--intermediate {cfg.intermediate} must be a multiple of {GROUP} (the INT4 scale group)")
    if cfg.mode == "ep":
        if cfg.experts % cfg.world_size:
            raise _args.UsageError(f"--experts {cfg.experts} is not divisible by --world-size {cfg.world_size}: "
                                   "EP gives every rank the same number of experts")
        if cfg.family not in ("auto", *EP_FAMILIES):
            raise _args.UsageError(f"--family {cfg.family!r} is not an EP family; with --mode ep valid: auto, "
                                   f"{', '.join(EP_FAMILIES)}")
    else:
        if cfg.intermediate % (cfg.world_size * GROUP):
            raise _args.UsageError(
                f"--intermediate {cfg.intermediate} must split into --world-size {cfg.world_size} slices that are "
                f"multiples of {GROUP} (w2's K slice keeps whole scale groups)")
        if cfg.family not in ("auto", "indexed"):
            raise _args.UsageError(f"--family {cfg.family!r} is not a TP family; with --mode tp valid: auto, indexed")
    if cfg.device == "cpu" and _cuda_count() > 0:
        raise _args.UsageError("--device cpu runs the GEMMs on the float32 reference, which is only for machines "
                               "without a CUDA device; on this one use --device cuda (NCCL, one GPU per rank)")
    if cfg.device == "cuda" or (cfg.device == "auto" and _cuda_count() > 0):
        if _cuda_count() < cfg.world_size:
            raise _args.UsageError(f"--world-size {cfg.world_size} needs one GPU per rank; this machine has "
                                   f"{_cuda_count()} (use --device cpu for gloo on the CPU)")
    return cfg


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# ---------------------------------------------------------------------------------------------
# the layer, the same on every rank


def make_layer(cfg: Config, device="cpu"):
    """(q13 [E, 2I, H], s13, q2 [E, H, I], s2, router [E, H]) from cfg.seed, drawn on `device` (every
    rank of a run draws on the same kind of device, so every rank gets the same layer; a Kimi-sized
    layer is drawn on the GPU in moments where the CPU would take minutes)."""
    import torch

    from chord.lab.bench.inputs import random_int4

    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(cfg.seed)
    q13, s13 = random_int4(cfg.experts, 2 * cfg.intermediate, cfg.hidden, g, device)
    q2, s2 = random_int4(cfg.experts, cfg.hidden, cfg.intermediate, g, device)
    router = torch.randn(cfg.experts, cfg.hidden, generator=g, device=device) / math.sqrt(cfg.hidden)
    return q13, s13, q2, s2, router


def make_tokens(cfg: Config, rank: int):
    """bf16 hidden states [T, H] of `rank` (EP: each rank its own; TP: the same on all)."""
    import torch

    seed = cfg.seed * 1_000_003 + 7 + (rank if cfg.mode == "ep" else 0)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(cfg.tokens, cfg.hidden, generator=g).to(torch.bfloat16)


def route(x, router, top_k: int):
    """The router: softmax over all E experts' logits, top-k, weights renormalised (float32)."""
    import torch

    probs = torch.softmax(x.float() @ router.t().to(x.device), dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


def tp_slice(q13, s13, q2, s2, rank: int, world: int):
    """Rank's 1/world of every expert's intermediate dimension: gate and up rows of w13, w2's K columns."""
    import torch

    inter = q13.shape[1] // 2
    step = inter // world
    lo, hi = rank * step, (rank + 1) * step
    rows = torch.cat((torch.arange(lo, hi), torch.arange(inter + lo, inter + hi))).to(q13.device)
    return (q13[:, rows].contiguous(), s13[:, rows].contiguous(), q2[:, :, lo:hi].contiguous(),
            s2[:, :, lo // GROUP:hi // GROUP].contiguous())


# ---------------------------------------------------------------------------------------------
# the humming calls (vLLM's sequence)


class Experts:
    """w13 and w2 of the rank's experts as vLLM holds them, and the provider's part of a forward."""

    def __init__(self, q13, s13, q2, s2, family: str, device):
        import torch

        from chord.lab.bench import vllm_sequence as vs

        self.family = family
        self.w13 = vs.build_layer("w13", q13.to(device), s13.to(device), gated=True, families=[family], device=device)
        self.w2 = vs.build_layer("w2", q2.to(device), s2.to(device), gated=False, families=[family], device=device)
        self.cc = vs.compute_config(family)
        self.inter = int(q2.shape[2])
        self.hidden = int(q13.shape[2])
        self.num_experts = int(q13.shape[0])
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
        self.locks = torch.zeros(8 * sms, dtype=torch.int32, device=device)

    def _forward(self, layer, x, out, **kw):
        from humming.forward import humming_forward

        return humming_forward(layer.config, inputs=x, weight=layer.weight, weight_scale=layer.weight_scale,
                               zero_point=layer.zero_point, bias=layer.bias, weight_scale_2=layer.weight_scale_2,
                               input_scale=None, input_scale_2=None, outputs=out, locks=self.locks,
                               compute_config=self.cc, tuning_config=layer.table_strs[self.family], **kw)

    def _activation(self, gu, act, **layout):
        from humming.forward import may_process_input

        from chord.lab.bench.vllm_sequence import SILU_AND_MUL

        may_process_input(self.w2.config, gu, outputs=act, **SILU_AND_MUL, **layout)

    def grouped(self, rows, local_ids):
        """EP: rows [R, H] each routed to one local expert -> their down outputs [R, H] (bf16)."""
        import torch

        dev, e = rows.device, self.num_experts
        r = int(rows.shape[0])
        order = torch.argsort(local_ids.long(), stable=True)
        counts = torch.bincount(local_ids.long(), minlength=e)
        out = torch.empty(r, self.hidden, dtype=torch.bfloat16, device=dev)
        if r == 0:
            return out
        if self.family == "grouped_contiguous":
            offsets = torch.zeros(e + 1, dtype=torch.int64, device=dev)
            torch.cumsum(counts, 0, out=offsets[1:])
            x = rows[order].contiguous()
            gu = torch.empty(r, 2 * self.inter, dtype=torch.bfloat16, device=dev)
            act = torch.empty(r, self.inter, dtype=torch.bfloat16, device=dev)
            dn = torch.empty(r, self.hidden, dtype=torch.bfloat16, device=dev)
            kw = dict(valid_shape_m=r, expert_layout=offsets)
            self._forward(self.w13, x, gu, **kw)
            self._activation(gu, act, layout="normal", num_valid_tokens=offsets[-1:])
            self._forward(self.w2, act, dn, **kw)
            out[order] = dn
            return out
        # grouped_masked: [E, max_rows, H] with int32 counts
        max_rows = max(1, int(counts.max()))
        starts = torch.zeros(e, dtype=torch.int64, device=dev)
        torch.cumsum(counts[:-1], 0, out=starts[1:])
        sorted_ids = local_ids.long()[order]
        slot = sorted_ids * max_rows + (torch.arange(r, device=dev) - starts[sorted_ids])
        x = torch.zeros(e * max_rows, self.hidden, dtype=torch.bfloat16, device=dev)
        x[slot] = rows[order]
        num = counts.to(torch.int32)
        gu = torch.empty(e * max_rows, 2 * self.inter, dtype=torch.bfloat16, device=dev)
        act = torch.empty(e * max_rows, self.inter, dtype=torch.bfloat16, device=dev)
        dn = torch.empty(e * max_rows, self.hidden, dtype=torch.bfloat16, device=dev)
        kw = dict(valid_shape_m=r, expert_layout=num)
        self._forward(self.w13, x, gu, **kw)
        self._activation(gu, act, layout="grouped_mask", expert_tokens=num)
        self._forward(self.w2, act, dn, **kw)
        out[order] = dn[slot]
        return out

    def indexed(self, x, topk_ids):
        """TP: tokens [M, H] with their routing [M, top_k] -> down outputs per route [M*top_k, H] (bf16)."""
        import torch

        from chord import routing

        dev = x.device
        m, top_k = (int(v) for v in topk_ids.shape)
        valid = m * top_k
        r13 = routing.align_block_size(topk_ids, self.w13.block_size("indexed", valid), self.num_experts,
                                       ignore_invalid_experts=True)
        b2 = self.w2.block_size("indexed", valid)
        r2 = r13 if b2 == self.w13.block_size("indexed", valid) else routing.align_block_size(
            topk_ids, b2, self.num_experts, ignore_invalid_experts=True)
        gu = torch.empty(valid, 2 * self.inter, dtype=torch.bfloat16, device=dev)
        act = torch.empty(valid, self.inter, dtype=torch.bfloat16, device=dev)
        dn = torch.empty(valid, self.hidden, dtype=torch.bfloat16, device=dev)
        self._forward(self.w13, x, gu, sorted_ids=r13.sorted_ids, expert_ids=r13.expert_ids,
                      num_tokens_padded=r13.num_tokens_post_padded, valid_shape_m=valid, top_k=top_k)
        self._activation(gu, act, layout="normal")
        self._forward(self.w2, act, dn, sorted_ids=r2.sorted_ids, expert_ids=r2.expert_ids,
                      num_tokens_padded=r2.num_tokens_post_padded, valid_shape_m=valid, top_k=1)
        return dn


# ---------------------------------------------------------------------------------------------
# one rank


class _Clock:
    """Phase times in ms: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        self.torch = torch
        self.marks = []

    def mark(self):
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def spans(self) -> list[float]:
        if self.cuda:
            self.torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]


def _ep_forward(cfg: Config, experts: Experts, x, topk_w, topk_ids, rank: int, world: int, clock: _Clock):
    import torch
    import torch.distributed as dist

    dev = x.device
    e_local = cfg.experts // world
    clock.mark()
    # dispatch: routes sorted by owner rank, counts exchanged, then the rows and their local expert ids
    flat = topk_ids.reshape(-1).long()
    owner = flat // e_local
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
    send_rows = x[order // cfg.top_k].contiguous()
    send_ids = (flat[order] % e_local).contiguous()
    recv_rows = torch.empty(sum(recv_splits), cfg.hidden, dtype=x.dtype, device=dev)
    recv_ids = torch.empty(sum(recv_splits), dtype=torch.int64, device=dev)
    dist.all_to_all_single(recv_rows, send_rows, recv_splits, send_splits)
    dist.all_to_all_single(recv_ids, send_ids, recv_splits, send_splits)
    clock.mark()
    # the rank's experts on the rows it received
    done = experts.grouped(recv_rows, recv_ids)
    clock.mark()
    # combine: rows back to where they came from, weighted sum per token
    back = torch.empty(sum(send_splits), cfg.hidden, dtype=done.dtype, device=dev)
    dist.all_to_all_single(back, done, send_splits, recv_splits)
    per_route = torch.empty_like(back)
    per_route[order] = back
    out = (per_route.float().view(cfg.tokens, cfg.top_k, cfg.hidden) * topk_w.unsqueeze(-1)).sum(1)
    clock.mark()
    return out, {"rows_sent": int(sum(send_splits)), "rows_received": int(sum(recv_splits))}


def _tp_forward(cfg: Config, experts: Experts, x, topk_w, topk_ids, rank: int, world: int, clock: _Clock):
    import torch.distributed as dist

    clock.mark()
    clock.mark()  # no dispatch: every rank has every token
    dn = experts.indexed(x, topk_ids)
    clock.mark()
    out = (dn.float().view(cfg.tokens, cfg.top_k, cfg.hidden) * topk_w.unsqueeze(-1)).sum(1)
    dist.all_reduce(out)
    clock.mark()
    return out, {"rows": int(dn.shape[0])}


def run_rank(rank: int, world: int, cfg: Config, init_method: str | None, result_path: str | None,
             local_rank: int | None = None) -> dict:
    """One rank's whole run: process group, layer, `cfg.iters` timed forwards, the check, the report."""
    os.environ.update(MULTICAST_OFF)
    import contextlib

    import torch
    import torch.distributed as dist

    from chord.lab.bench.inputs import TOLERANCE, rel_err
    from chord.formats import QuantizedExperts
    from chord.reference import moe_ref

    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        device = torch.device("cuda", rank if local_rank is None else local_rank)
        torch.cuda.set_device(device)
        backend, ctx = "nccl", contextlib.nullcontext()
    else:
        from humming import _chord

        device = torch.device("cpu")
        backend, ctx = "gloo", _chord.cpu_reference_backend()
    # Import what the rank's GEMM path imports before the process group exists. torch._dynamo (which
    # the humming forward path pulls in) keeps references to the default process group that exists
    # when it is first imported; then destroy_process_group cannot free the group, its gloo threads
    # outlive the rank and race the interpreter's exit (std::terminate, SIGABRT, about one world-2 CPU
    # run in seven). tests/test_distributed.py checks that no gloo thread is left after a rank.
    import torch._dynamo  # noqa: F401
    import humming.forward  # noqa: F401

    kw = dict(backend=backend, rank=rank, world_size=world)
    if init_method is not None:
        kw["init_method"] = init_method
    if use_cuda:
        kw["device_id"] = device
    dist.init_process_group(**kw)
    try:
        with ctx:
            q13, s13, q2, s2, router = make_layer(cfg, device)
            x = make_tokens(cfg, rank).to(device)
            topk_w, topk_ids = route(x, router, cfg.top_k)
            family = cfg.gemm_family()
            if cfg.mode == "ep":
                e_local = cfg.experts // world
                sl = slice(rank * e_local, (rank + 1) * e_local)
                experts = Experts(q13[sl], s13[sl], q2[sl], s2[sl], family, device)
                forward = _ep_forward
            else:
                experts = Experts(*tp_slice(q13, s13, q2, s2, rank, world), family, device)
                forward = _tp_forward
            times, out, extra = [], None, {}
            for _ in range(cfg.iters + 1):  # the first one warms up (JIT, allocator) and is not reported
                dist.barrier()
                clock = _Clock(device)
                out, extra = forward(cfg, experts, x, topk_w, topk_ids, rank, world, clock)
                times.append(clock.spans())
            times = times[1:]
            ref = moe_ref(x, QuantizedExperts(q13, s13), QuantizedExperts(q2, s2), topk_w, topk_ids,
                          bf16_intermediates=True)  # on the rank's device, float32
            err = rel_err(out, ref)
        mine = {"rank": rank, "device": str(device), "family": family, "rel_err": err, "ok": err < TOLERANCE,
                **extra, "ms": {p: statistics.median(t[i] for t in times) for i, p in enumerate(PHASES)},
                "ms_all": {p: [t[i] for t in times] for i, p in enumerate(PHASES)}}
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        result = {"config": dataclasses.asdict(cfg), "backend": backend, "tolerance": TOLERANCE,
                  "multicast_env": {k: os.environ.get(k) for k in MULTICAST_OFF}, "ranks": gathered,
                  "ok": all(r["ok"] for r in gathered)}
        if rank == 0:
            print(format_table(result), flush=True)
            if result_path:
                Path(result_path).write_text(json.dumps(result, indent=2) + "\n")
        return result
    finally:
        dist.destroy_process_group()


def format_table(result: dict) -> str:
    c = result["config"]
    head = (f"chord distributed: mode {c['mode']}, world {c['world_size']} ({result['backend']}), tokens/rank "
            f"{c['tokens']}, E {c['experts']} H {c['hidden']} I {c['intermediate']} top_k {c['top_k']}, median of "
            f"{c['iters']}")
    lines = [head, f"{'rank':>4} {'family':<18} {'dispatch ms':>11} {'gemms ms':>9} {'combine ms':>10} "
                   f"{'rel_err':>9} check"]
    for r in result["ranks"]:
        ms = r["ms"]
        lines.append(f"{r['rank']:>4} {r['family']:<18} {ms['dispatch']:>11.3f} {ms['gemms']:>9.3f} "
                     f"{ms['combine']:>10.3f} {r['rel_err']:>9.2e} {'PASS' if r['ok'] else 'FAIL'}")
    lines.append(f"reference check (tolerance {result['tolerance']:g}): {'PASS' if result['ok'] else 'FAIL'}")
    return "\n".join(lines)


def _spawned(rank: int, world: int, cfg: Config, init_method: str, result_path: str) -> None:
    run_rank(rank, world, cfg, init_method, result_path)


def run(cfg: Config, out: str | os.PathLike | None = None) -> dict:
    """Checks `cfg`, runs its world (spawned here, or this process's rank under torchrun) and returns
    rank 0's result: per-rank errors and phase times. With `out`, rank 0 writes it as JSON there."""
    check_config(cfg)
    os.environ.update(MULTICAST_OFF)  # before any process (and NCCL communicator) exists
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        world = int(os.environ["WORLD_SIZE"])
        if world != cfg.world_size:
            raise _args.UsageError(f"--world-size {cfg.world_size} differs from torchrun's WORLD_SIZE={world}")
        return run_rank(int(os.environ["RANK"]), world, cfg, None, str(out) if out else None,
                        local_rank=int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="chord-dist-") as tmp:
        init = f"file://{Path(tmp) / 'rendezvous'}"
        path = str(Path(tmp) / "result.json")
        mp.spawn(_spawned, args=(cfg.world_size, cfg, init, path), nprocs=cfg.world_size, join=True)
        result = json.loads(Path(path).read_text())
    if out:
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result


# ---------------------------------------------------------------------------------------------
# command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Config()
    p.add_argument("--mode", choices=MODES, default=d.mode,
                   help="ep: experts split over ranks, rows exchanged by all_to_all; tp: every expert's intermediate "
                        "split over ranks, partial outputs all-reduced")
    p.add_argument("--world-size", type=int, default=d.world_size, help="ranks (one GPU each with CUDA)")
    p.add_argument("--tokens", type=int, default=d.tokens, help="tokens per rank (TP: the same tokens on every rank)")
    p.add_argument("--experts", type=int, default=d.experts, help="experts E (Kimi K2.x: 384)")
    p.add_argument("--hidden", type=int, default=d.hidden, help="hidden size H (Kimi K2.x: 7168)")
    p.add_argument("--intermediate", type=int, default=d.intermediate, help="moe intermediate I (Kimi K2.x: 2048)")
    p.add_argument("--top-k", type=int, default=d.top_k, help="experts per token (Kimi K2.x: 8)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of weights, router and tokens (default 0)")
    p.add_argument("--family", choices=FAMILIES, default=d.family,
                   help=f"GEMM family; auto: EP grouped_masked up to {MASKED_MAX_TOKENS} tokens per rank, "
                        "grouped_contiguous above; TP indexed")
    p.add_argument("--iters", type=int, default=d.iters, help="timed forwards after one warm-up")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device,
                   help="cuda: NCCL, one GPU per rank; cpu: gloo on the float32 reference path; auto: cuda if present")
    p.add_argument("--out", dest="dist_out", default=None, metavar="FILE", help="write rank 0's result JSON here")


def config_from_args(args: argparse.Namespace) -> Config:
    return Config(mode=args.mode, world_size=args.world_size, tokens=args.tokens, experts=args.experts,
                  hidden=args.hidden, intermediate=args.intermediate, top_k=args.top_k, seed=args.seed,
                  family=args.family, iters=args.iters, device=args.device)


def check_args(args: argparse.Namespace) -> None:
    check_config(config_from_args(args))
    if args.dist_out is not None:
        _args.check_out_file("--out", args.dist_out, ".json")


def command(args: argparse.Namespace) -> int:
    result = run(config_from_args(args), args.dist_out)
    return 0 if result["ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chord.lab.distributed", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        check_args(args)
    except ValueError as exc:
        print(f"chord distributed: {exc}", file=sys.stderr)
        return 2
    return command(args)


if __name__ == "__main__":
    sys.exit(main())
