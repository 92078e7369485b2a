"""chord.lab.distributed on the CPU: gloo process groups, the GEMMs on the float32 reference behind
the humming root. EP and TP at world sizes 1 and 2 (EP also 4), each rank's output checked against the
whole layer's float32 reference; bad arguments refused before any process starts."""
import json
import os
import socket
from pathlib import Path

import pytest
import torch

from chord import cli
from chord.formats import QuantizedExperts
from chord.lab import distributed as dist_lab
from chord.lab.bench.inputs import TOLERANCE, rel_err
from chord.reference import moe_ref

pytestmark = [pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built"),
              pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path (gloo on the float32 reference) is "
                                 "refused where CUDA exists; tests/gpu/test_distributed_gpu.py runs NCCL")]

SMALL = dict(tokens=16, experts=8, hidden=128, intermediate=64, top_k=2, iters=1, device="cpu")


def _checked(result, cfg):
    assert result["backend"] == "gloo"
    assert result["multicast_env"] == dist_lab.MULTICAST_OFF
    assert len(result["ranks"]) == cfg.world_size
    assert [r["rank"] for r in result["ranks"]] == list(range(cfg.world_size))
    for r in result["ranks"]:
        assert r["family"] == cfg.gemm_family()
        assert r["rel_err"] < TOLERANCE, r
        assert r["ok"] and set(r["ms"]) == set(dist_lab.PHASES) and all(v >= 0 for v in r["ms"].values())
    assert result["ok"]


@pytest.mark.parametrize("mode,world,family", [
    ("ep", 1, "grouped_contiguous"), ("ep", 2, "grouped_masked"), ("ep", 2, "grouped_contiguous"),
    ("tp", 1, "indexed"), ("tp", 2, "indexed")])
def test_spawned_world_matches_the_reference(mode, world, family, tmp_path):
    cfg = dist_lab.Config(mode=mode, world_size=world, family=family, **SMALL)
    out = tmp_path / "dist.json"
    result = dist_lab.run(cfg, out)
    _checked(result, cfg)
    assert json.loads(out.read_text()) == result
    if mode == "ep":  # every route went to its owner and came back
        assert sum(r["rows_received"] for r in result["ranks"]) == world * cfg.tokens * cfg.top_k
        assert all(r["rows_sent"] == cfg.tokens * cfg.top_k for r in result["ranks"])


def _threads() -> list[str]:
    return sorted(Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task"))


def _rank_then_threads(rank, world, cfg, init, out_dir):
    dist_lab.run_rank(rank, world, cfg, init, None)
    Path(out_dir, f"threads-{rank}.json").write_text(json.dumps(_threads()))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread names are read from /proc")
@pytest.mark.parametrize("mode,family", [("ep", "grouped_masked"), ("tp", "indexed")])
def test_a_rank_leaves_no_gloo_thread_behind(mode, family, tmp_path):
    """Once run_rank returns, its process group is freed: no gloo thread is left to race the
    interpreter's exit. (Importing torch._dynamo after init_process_group kept the group alive, and
    about one world-2 run in seven died of SIGABRT at exit after a passing check.)"""
    import torch.multiprocessing as mp

    cfg = dist_lab.Config(mode=mode, world_size=2, family=family, **SMALL)
    mp.spawn(_rank_then_threads, args=(2, cfg, f"file://{tmp_path / 'rendezvous'}", str(tmp_path)), nprocs=2,
             join=True)
    for rank in range(2):
        left = json.loads((tmp_path / f"threads-{rank}.json").read_text())
        assert not [t for t in left if "gloo" in t], (rank, left)


def test_four_ranks_ep():
    """Four ranks (two experts each) on the CPU; TP's four-way split is checked without processes below."""
    cfg = dist_lab.Config(mode="ep", world_size=4, **{**SMALL, "tokens": 8})
    _checked(dist_lab.run(cfg), cfg)


@pytest.fixture
def torchrun_rank(monkeypatch):
    """This process as rank 0 of a world of 1, as torchrun would start it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    for k in dist_lab.MULTICAST_OFF:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda *a, **k: pytest.fail("spawned under torchrun"))


def test_torchrun_rank_runs_in_this_process(torchrun_rank):
    """Under torchrun (RANK / WORLD_SIZE set) nothing is spawned: this process is the rank."""
    cfg = dist_lab.Config(mode="ep", world_size=1, family="grouped_masked", **SMALL)
    _checked(dist_lab.run(cfg), cfg)
    assert all(os.environ[k] == v for k, v in dist_lab.MULTICAST_OFF.items())


def test_a_wrong_slice_fails_the_check(torchrun_rank, monkeypatch, tmp_path):
    """The check bites: TP with one expert's down weights zeroed on the rank misses the reference."""
    real = dist_lab.tp_slice

    def broken(*a):
        q13, s13, q2, s2 = real(*a)
        q2 = q2.clone()
        q2[0] = 0
        return q13, s13, q2, s2

    monkeypatch.setattr(dist_lab, "tp_slice", broken)
    cfg = dist_lab.Config(mode="tp", world_size=1, **{**SMALL, "experts": 2, "top_k": 1})
    out = tmp_path / "r.json"
    result = dist_lab.run(cfg, out)
    assert not result["ok"] and result["ranks"][0]["rel_err"] > 0.1
    assert "FAIL" in dist_lab.format_table(result) and not json.loads(out.read_text())["ok"]


def test_tp_slices_sum_to_the_whole_layer():
    """The TP split itself: the slices' partial layers add up to the whole layer (float32)."""
    cfg = dist_lab.Config(mode="tp", world_size=4, **{**SMALL, "intermediate": 128})
    q13, s13, q2, s2, router = dist_lab.make_layer(cfg)
    x = dist_lab.make_tokens(cfg, 0)
    w, ids = dist_lab.route(x, router, cfg.top_k)
    whole = moe_ref(x, QuantizedExperts(q13, s13), QuantizedExperts(q2, s2), w, ids)
    parts = sum(moe_ref(x, QuantizedExperts(a, b), QuantizedExperts(c, d), w, ids)
                for a, b, c, d in (dist_lab.tp_slice(q13, s13, q2, s2, r, 4) for r in range(4)))
    assert rel_err(parts, whole) < 1e-5
    # the router: top-k distinct experts per token, weights summing to one
    assert ids.shape == (cfg.tokens, cfg.top_k) and all(len(set(row)) == cfg.top_k for row in ids.tolist())
    assert torch.allclose(w.sum(-1), torch.ones(cfg.tokens))


def test_weights_are_the_same_for_every_rank_and_tokens_differ_in_ep():
    cfg = dist_lab.Config(**SMALL)
    a, b = dist_lab.make_layer(cfg), dist_lab.make_layer(cfg)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(dist_lab.make_tokens(cfg, 0), dist_lab.make_tokens(cfg, 1))
    tp = dist_lab.Config(mode="tp", **SMALL)
    assert torch.equal(dist_lab.make_tokens(tp, 0), dist_lab.make_tokens(tp, 1))


@pytest.mark.parametrize("argv,named", [
    (["--experts", "15", "--world-size", "2"], ["--experts 15", "--world-size 2"]),
    (["--mode", "tp", "--intermediate", "96", "--world-size", "2"], ["--intermediate 96", "--world-size 2"]),
    (["--top-k", "9", "--experts", "8", "--world-size", "1"], ["--top-k 9", "--experts 8"]),
    (["--hidden", "100", "--world-size", "1"], ["--hidden 100"]),
    (["--world-size", "0"], ["--world-size"]),
    (["--tokens", "0"], ["--tokens"]),
    (["--seed", "-1"], ["--seed"]),
    (["--mode", "tp", "--family", "grouped_masked"], ["--family 'grouped_masked'", "--mode tp"]),
    (["--mode", "ep", "--family", "indexed"], ["--family 'indexed'", "--mode ep"]),
    (["--device", "cuda", "--world-size", "2"], ["--world-size 2", "one GPU per rank"]),
    (["--device", "cpu", "--out", "result.txt"], ["--out"]),
])
def test_bad_arguments_are_refused_before_any_process_starts(argv, named, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda *a, **k: pytest.fail("spawned with a bad argument"))
    monkeypatch.setattr(dist_lab, "run_rank", lambda *a, **k: pytest.fail("ran with a bad argument"))
    rc = cli.main(["distributed", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.startswith("chord distributed: ")
    for text in named:
        assert text in err, (text, err)


def test_module_entry_refuses_the_same_way(capsys, monkeypatch):
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda *a, **k: pytest.fail("spawned with a bad argument"))
    assert dist_lab.main(["--experts", "6", "--world-size", "4", "--device", "cpu"]) == 2
    assert "--experts 6 is not divisible by --world-size 4" in capsys.readouterr().err


def test_valid_arguments_reach_the_run(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(dist_lab, "run", lambda cfg, out=None: seen.update(cfg=cfg, out=out) or {"ok": False})
    out = tmp_path / "r.json"
    rc = cli.main(["distributed", "--mode", "tp", "--world-size", "2", "--tokens", "5", "--experts", "4",
                   "--top-k", "2", "--device", "cpu", "--out", str(out)])
    assert rc == 1  # a failed check is exit 1
    assert seen["cfg"] == dist_lab.Config(mode="tp", world_size=2, tokens=5, experts=4, top_k=2, device="cpu")
    assert seen["out"] == str(out)
    assert seen["cfg"].gemm_family() == "indexed"
    assert dist_lab.Config(tokens=64).gemm_family() == "grouped_masked"
    assert dist_lab.Config(tokens=65).gemm_family() == "grouped_contiguous"


def test_cpu_device_is_refused_where_cuda_exists(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda *a, **k: pytest.fail("spawned with a bad argument"))
    assert cli.main(["distributed", "--device", "cpu"]) == 2
    assert "--device cpu" in capsys.readouterr().err
