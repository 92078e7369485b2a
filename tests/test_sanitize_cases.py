"""tools/sanitize_cases.py on CPU: the case list (`--list` runs without a GPU), its coverage of every
family x main loop x bad routing value x trusted path, the schedules a kernel-cache builder
collects, and each trusted case's contract (the bad value really lands in the routing, and the
rows the contract defines are enough to prove the kernel ran)."""
from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch
from conftest import TOOLS_DIR, load_tool

from chord.testing import random_experts


@pytest.fixture(scope="module")
def sc():
    """tools/sanitize_cases.py imported as `sanitize_cases` (as chord precompile --tests imports it)."""
    sys.path.insert(0, str(TOOLS_DIR))
    try:
        import sanitize_cases
    finally:
        sys.path.remove(str(TOOLS_DIR))
    return sanitize_cases


# the bad values the trusted paths must survive (issue 27), by family
BAD = {"indexed": {"expert_id_99", "sorted_id_1e6", "padded_count_1e6"},
       "grouped_contiguous": {"offsets_past_input", "offsets_not_monotonic"},
       "grouped_masked": {"counts_over_max_rows"}}


def test_schedules_option_refuses_bad_ids_before_any_gpu_work(sc, capsys):
    assert sc.main(["--schedules", "idx-m8n64k64-w4-s3-c1-sk2-skc1,bogus"]) == 2
    assert "--schedules" in capsys.readouterr().out
    assert sc.main(["--schedules"]) == 2
    assert "comma-separated list of schedule ids" in capsys.readouterr().out
    assert sc.main(["--schedules", "idx-m8n64k64-w4-s3-c1", "--bogus"]) == 2
    assert "unknown option --bogus" in capsys.readouterr().out


def test_list_runs_without_a_gpu():
    out = subprocess.run([sys.executable, str(TOOLS_DIR / "sanitize_cases.py"), "--list"], capture_output=True,
                         text=True, cwd=TOOLS_DIR.parent, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert sum(line.startswith("trusted ") for line in lines) == 36
    assert "trusted indexed wgmma padded_count_1e6 plan idx-m32n128k64-w8-s3-c1-wgmma" in lines
    bad = subprocess.run([sys.executable, str(TOOLS_DIR / "sanitize_cases.py"), "--nope"], capture_output=True,
                         text=True, cwd=TOOLS_DIR.parent, timeout=300)
    assert bad.returncode == 2 and "unknown option --nope" in bad.stdout


def test_trusted_cases_cover_every_family_mainloop_value_and_path(sc):
    got = {(c.family, c.mainloop, c.value, c.path) for c in sc.TRUSTED_CASES}
    want = {(f, m, v, p) for f, values in BAD.items() for m, v, p in itertools.product(("mma", "wgmma"), values,
                                                                                         ("unchecked", "plan",
                                                                                          "humming"))}
    assert got == want and len(sc.TRUSTED_CASES) == len(want) == 36


def test_trusted_schedules_run_their_main_loop_and_can_have_a_plan(sc):
    for case in sc.TRUSTED_CASES:
        s = case.schedule
        assert s.family == case.family and s.mainloop == case.mainloop, case.name
        assert not s.tma_x  # a tensor map encodes x's address: such a schedule never gets a launch plan
        assert s in sc.schedules(case.family, True) and s in sc.schedules(case.family, False)


def test_the_kernel_cache_builder_collects_every_sanitizer_schedule(sc):
    from chord.lab import precompile

    collected = set(precompile.collect("h200", tests=True))
    for family in BAD:
        for s in sc.schedules(family, False):
            assert s.id in collected, s.id
    assert {c.schedule.id for c in sc.TRUSTED_CASES} <= collected


@pytest.fixture(scope="module")
def experts():
    return random_experts(6, 256, 256, seed=1, device="cpu")


@pytest.mark.parametrize("family, value", [(f, v) for f, vs in BAD.items() for v in sorted(vs)])
@pytest.mark.parametrize("mainloop", ["mma", "wgmma"])
def test_each_bad_value_lands_and_leaves_rows_to_prove(sc, experts, family, value, mainloop):
    """On CPU tensors: the setup's good routing is consistent, spoil() writes the bad value into the
    very tensors the launch reads, and the contract still defines rows on which the kernel must be
    seen to have run (and, where the bad value skips work, rows it must not write)."""
    from chord import ops

    qe, _ = experts
    s = sc.trusted_schedule(family, mainloop)
    st = sc._SETUPS[family](s, qe, value)
    before = [t.clone() for t in st.layout]
    if family == "indexed":  # the good routing passes the checked read (range and consistency)
        ops._check_indexed_values("t", *st.layout, 6, s.block_m, st.x.shape[0] * st.top_k, True)
    st.spoil()
    after = list(st.layout)
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "spoil() changed nothing"
    flat = torch.cat([t.reshape(-1).long() for t in after])
    marks = {"expert_id_99": 99, "sorted_id_1e6": 10**6, "padded_count_1e6": 10**6, "offsets_past_input": 2**40,
             "counts_over_max_rows": 10**6}
    if value in marks:
        assert bool((flat == marks[value]).any())
    else:  # not monotonic
        assert bool((after[0][1:] < after[0][:-1]).any())
    valid = st.valid.reshape(-1)
    assert int(valid.sum()) >= 4, "too few rows to show the kernel ran"
    ref = st.ref.reshape(-1, st.ref.shape[-1])
    assert not torch.isnan(ref[valid]).any() and torch.isnan(ref[~valid]).all()
    if value in ("expert_id_99", "sorted_id_1e6", "counts_over_max_rows", "offsets_not_monotonic"):
        assert not bool(valid.all()), "the bad value must leave rows the kernel skips (or that are not defined)"
    if value == "offsets_not_monotonic":
        assert st.skip is not None and bool(st.skip.any()) and not bool((st.skip & st.valid).any())


# ---- the whole trusted-path run on CPU, against an emulated kernel -------------------------


def _emulate(items, skip_work=False):
    """The row contract of csrc/moe/rows.cuh applied on the host to a launch's signature items
    (chord.ops' plan items): which rows a kernel reads and writes whatever the routing says."""
    from chord import launch

    from humming import _chord

    tag = items[0]
    if tag == launch.INDEXED:
        _, top_k, bm, x, qw, sc, sorted_ids, expert_ids, ntpp, out = items
    else:
        _, x, qw, sc, layout, out = items
    if skip_work:
        return
    w = _chord.quantized_experts(qw, sc).dequantize().float()
    e_count = w.shape[0]
    xf = x.float().reshape(-1, x.shape[-1])
    o = out.view(-1, out.shape[-1])
    if tag == launch.INDEXED:
        used, num_valid = int(ntpp[0]), x.shape[0] * top_k
        blocks = min(-(-max(used, 0) // bm), sorted_ids.numel() // bm)
        for b in range(blocks):
            e = int(expert_ids[b])
            if not 0 <= e < e_count:
                continue
            for i in sorted_ids[b * bm:(b + 1) * bm].tolist():
                if 0 <= i < num_valid:
                    o[i] = (xf[i // top_k] @ w[e].t()).to(o.dtype)
    elif tag == launch.CONTIGUOUS:
        rows = x.shape[0]
        off = [min(max(v, 0), rows) for v in layout.tolist()]
        for e in range(e_count):
            lo, hi = off[e], max(off[e], off[e + 1])
            o[lo:hi] = (xf[lo:hi] @ w[e].t()).to(o.dtype)
    else:
        max_rows = x.shape[1]
        for e, c in enumerate(layout.tolist()):
            c = min(max(c, 0), max_rows)
            o[e * max_rows:e * max_rows + c] = (xf[e * max_rows:e * max_rows + c] @ w[e].t()).to(o.dtype)


def _signature(schedule, items):
    return (schedule,) + tuple((t.dtype, tuple(t.shape), t.stride(), t.data_ptr() % 16) if isinstance(t, torch.Tensor)
                               else (type(t), t) for t in items)


@pytest.fixture
def emulated(sc, monkeypatch):
    """chord.ops and chord.launch on CPU tensors with the kernel emulated: the Python launch path
    (ops._launch, with the call's launch record) runs the row contract and records a plan; the C module (launch.MODULE) launches
    a recorded plan's signature the same way."""
    from chord import launch, ops

    from humming import _chord

    state = {"skip": False}
    launch.status()  # loaded once (unavailable on this machine), then the fake module below

    class FakeModule:
        @staticmethod
        def launch(plans, schedule, *items):
            if _signature(schedule, items) not in plans:
                return False
            _emulate(items, state["skip"])
            return None

    def python_launch(sched, kernel, grid, x, fields, op, schedule_id, record):
        _emulate(record.items, state["skip"])
        launch.PLANS[_signature(schedule_id, record.items)] = b""

    monkeypatch.setattr(launch, "MODULE", FakeModule)
    monkeypatch.setattr(ops, "_kernel", lambda sched, qweight, n: None)  # no kernel to build: emulated
    monkeypatch.setattr(ops, "_launch", python_launch)
    monkeypatch.setattr(ops, "check_cuda_sm90", lambda t, name="x": None)
    monkeypatch.setattr(_chord, "_use_reference", lambda x: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(sc, "poisoned", lambda *shape: torch.full(shape, float("nan"), dtype=torch.bfloat16))
    yield state
    launch.clear()


@pytest.mark.parametrize("case_index", range(36))
def test_each_trusted_case_runs_and_proves_on_an_emulated_kernel(sc, experts, emulated, case_index):
    """The script's own logic end to end on CPU (setups, in-place spoiling, the three paths, the
    launch counts, the proofs) with the kernel replaced by its row contract: every case passes,
    on the path it names; and with a kernel that writes nothing every case fails its proof."""
    case = sc.TRUSTED_CASES[case_index]
    qe, pw = experts
    ran, fails = sc.run_trusted(case, qe, pw)
    assert not fails, fails
    want = {"unchecked": {"python": 1, "plan": 0}, "plan": {"python": 1, "plan": 1},
            "humming": {"python": 1, "plan": 1}}[case.path]
    assert ran == want, ran
    emulated["skip"] = True
    _, fails = sc.run_trusted(case, qe, pw)
    assert fails and all("not written" in f for f in fails), fails
