"""Host time of one GEMM call (CPU side, warm caches), Chord and upstream Humming: ``chord bench --host-time``.

Each call alone with time.perf_counter around it (chord.lab.bench.timing.host_time: the launch is
asynchronous, so this is the host's share; the GPU is kept ahead with a sleep kernel so no call
waits for a full launch queue). Measured, for one scenario's gate_up and down GEMMs:

* Chord's `humming_forward` (Chord's `humming` root), with the layer built by vLLM 0.33's
  load-time calls (:func:`chord_humming_calls`, through chord.lab.bench.vllm_sequence): what a vLLM
  server runs;
* `chord.ops.gemm_indexed` (routing trusted, as the bench calls it), `gemm_indexed_raw`, and
  `gemm_indexed` with the default routing check (its device->host read waits for the GPU, so its
  time includes the kernel: no sleep ahead of it);
* the driver's launch alone (`chord.jit.Kernel.launch` with a packed parameter block) and a torch
  elementwise kernel launch, the floor any per-call launch path pays on this host;
* where the C launch path is on (`chord.launch.status()`), the humming_forward and trusted
  chord.ops calls again with it off (`chord.launch.fast_launch(False)`): its ablation;
* with a Humming install folder: upstream Humming 0.1.20's `humming_forward` in its worker process
  (chord.lab.bench.humming_baseline.host_time_rows), same scenario, seed and calls.

``parts``: the pieces of the Python side of one raw call, each timed alone (the validation memo
key, the schedule id, the split-K buffer lookup, parameter packing, the raw stream).
``cprofile``: the trusted call under cProfile. Needs an sm_90 GPU.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable


def chord_humming_calls(sc, w, data, fi, device):
    """Chord's side of the vLLM-sequence comparison: the scenario's indexed gate_up and down as
    vLLM 0.33 calls them through Chord's own ``humming`` root (layers built by vLLM's load-time
    calls, chord.lab.bench.vllm_sequence), in this process: ``(gate_up(), down())``. Refuses when
    ``import humming`` is not Chord's root (upstream runs only in its worker process)."""
    import torch

    import chord
    import humming

    from chord.lab.bench import vllm_sequence as VS

    if not Path(humming.__file__).resolve().is_relative_to(Path(chord.__file__).resolve().parents[1]):
        raise RuntimeError(f"Chord's host time must import Chord's humming root, got {humming.__file__}")
    l13 = VS.build_layer("w13", w.q13, w.s13, gated=True, families=["indexed"], device=device)
    l2 = VS.build_layer("w2", w.q2, w.s2, gated=False, families=["indexed"], device=device)
    locks = torch.zeros(8 * torch.cuda.get_device_properties(device).multi_processor_count, dtype=torch.int32,
                        device=device)
    gate_up, down, *_ = VS.prepare_calls("indexed", sc, data, fi, l13, l2, locks, "all")
    return gate_up, down


def measure(scenario: str = "tp8-m1", *, calls: int = 2000, profile: str, humming_dir: str | None = None,
            parts: bool = False, cprofile: bool = False, suite=None, out: Callable[[str], None] = print) -> list:
    """Measures and prints (through `out`); returns the ``(name, median us, p90 us)`` rows."""
    import torch

    from chord import jit, launch, ops
    from chord.lab.bench import inputs as I
    from chord.lab.bench.runner import ChordAPI, _chord_calls
    from chord.lab.bench.suite import load_suite
    from chord.lab.bench.timing import host_time
    from chord.schedule import Schedule

    dev = torch.device("cuda")
    sc = load_suite(suite).scenario(scenario)
    w = I.expert_weights(sc, 0, dev)
    w13, w2 = ChordAPI.pack(w.q13, w.s13), ChordAPI.pack(w.q2, w.s2)
    data = I.scenario_data(sc, 0, dev)
    fi = I.family_inputs("indexed", data)
    prof = ChordAPI.profile(profile, sc)
    gate_up, down, gu, _dn, info = _chord_calls("indexed", sc, data, fi, w13, w2, prof)
    s1 = Schedule.from_id(info["schedule_gate_up"])  # the decision _chord_calls made, not a second one
    r1 = ChordAPI.align(data.topk_ids, s1.block_m, sc.experts)

    def checked():
        ops.gemm_indexed(fi.gate_up_in, w13, r1, top_k=sc.top_k, out=gu, schedule=s1)

    def raw():
        ops.gemm_indexed_raw(fi.gate_up_in, w13.qweight, w13.scales, r1.sorted_ids, r1.expert_ids,
                             r1.num_tokens_post_padded, gu, sc.top_k, s1.block_m, s1.id, check_routing=False)

    kernel = jit.kernel_for_schedule(s1)
    grid = (r1.sorted_ids.numel() // s1.block_m, s1.grid_n(sc.n_gate_up), s1.split_k)
    params = jit.pack_gemm_params(
        x=fi.gate_up_in.data_ptr(), qweight=w13.qweight.data_ptr(), scales=w13.scales.data_ptr(), out=gu.data_ptr(),
        sorted_ids=r1.sorted_ids.data_ptr(), expert_ids=r1.expert_ids.data_ptr(),
        num_tokens_post_padded=r1.num_tokens_post_padded.data_ptr(), n=sc.n_gate_up, k=sc.k_gate_up,
        num_experts=sc.experts, top_k=sc.top_k, num_valid_ids=sc.rows * sc.top_k, num_blocks=grid[0],
        **ops._split_args(s1, fi.gate_up_in, grid[0], grid[1]))
    stream = ops._raw_stream(dev.index or 0)
    scratch = torch.empty(64, device=dev)
    hf_gate_up, hf_down = chord_humming_calls(sc, w, data, fi, dev)

    rows = []
    fast = launch.status()
    for name, fn in ((f"Chord humming_forward gate_up (vLLM path; C launch path {fast})", hf_gate_up),
                     ("Chord humming_forward down (vLLM path)", hf_down),
                     ("chord.ops.gemm_indexed gate_up (trusted, as the bench)", gate_up),
                     ("chord.ops.gemm_indexed down (trusted)", down),
                     ("chord.ops.gemm_indexed_raw gate_up (trusted)", raw),
                     ("driver launch alone (jit.Kernel.launch)", lambda: kernel.launch(grid, (s1.threads, 1, 1), params,
                                                                                        dev.index or 0, stream)),
                     ("torch elementwise launch (scratch.add_(1))", lambda: scratch.add_(1))):
        h = host_time(fn, calls=calls)
        rows.append((name, h.median_us, h.p90_us))
    if launch.MODULE is not None:  # the ablation: the same calls on the Python launch path
        launch.fast_launch(False)
        try:
            for name, fn in (("Chord humming_forward gate_up, C launch path off (CHORD_FAST_LAUNCH=0)", hf_gate_up),
                             ("Chord humming_forward down, C launch path off", hf_down),
                             ("chord.ops.gemm_indexed gate_up (trusted), C launch path off", gate_up)):
                h = host_time(fn, calls=calls)
                rows.append((name, h.median_us, h.p90_us))
        finally:
            launch.fast_launch(True)
    # the checked call reads device values, so it waits for the GPU anyway: time it plainly
    h = host_time(checked, calls=min(calls, 500), keep_ahead=False)
    rows.append(("chord.ops.gemm_indexed gate_up (default: routing checked)", h.median_us, h.p90_us))

    if humming_dir:
        from chord.lab.bench import humming_baseline as HB

        rows += HB.host_time_rows(humming_dir, sc.id, calls)

    out(f"\nhost time per call, {sc.id}, schedules {info['schedule_gate_up']} / {info['schedule_down']}, "
        f"{torch.cuda.get_device_name()}")
    for name, med, p90 in rows:
        out(f"  {name:62s} median {med:6.1f} us  p90 {p90:6.1f} us")

    if parts:
        tensors = (fi.gate_up_in, w13.qweight, w13.scales, r1.sorted_ids, r1.expert_ids, r1.num_tokens_post_padded, gu)
        fresh = Schedule.from_id(s1.id)
        out("\nthe Python side of one raw call, piece by piece:")
        for name, fn in (("validation memo key (7 tensors' metadata)",
                          lambda: tuple((t.dtype, t.get_device(), t.shape, t.stride(), t.data_ptr() & 15)
                                        for t in tensors)),
                         ("schedule id (cached after the first read)", lambda: fresh.id),
                         ("split-K buffer lookup", lambda: ops._split_args(s1, fi.gate_up_in, grid[0], grid[1])),
                         ("parameter packing", lambda: jit.pack_gemm_params(x=1, qweight=2, scales=3, out=4, n=5, k=6,
                                                                            num_experts=7)),
                         ("raw CUDA stream", lambda: ops._raw_stream(dev.index or 0))):
            h = host_time(fn, calls=calls)
            out(f"  {name:62s} median {h.median_us:6.2f} us  p90 {h.p90_us:6.2f} us")

    if cprofile:
        import cProfile
        import io
        import pstats

        torch.cuda.synchronize()
        torch.cuda._sleep(50_000_000)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            gate_up()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        out(f"cProfile of {calls} trusted calls (times are totals over all calls):\n{text.getvalue()}")
    return rows
