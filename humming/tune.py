"""Tuning rows for vLLM (``humming.tune.get_heuristics_config``), taken from chord.schedule.

vLLM 0.33 asks once per layer for rows ``(min_m, max_m, config)`` and, per forward, picks the
row with ``min_m < valid_shape_m <= max_m`` (``valid_shape_m`` = routed rows on this GPU). For
the indexed family it runs ``moe_align_block_size`` with ``config["block_shape"][0]``, so that
entry is Chord's block_m for the range. The rows are chord.schedule's table for the layer
(humming adds no heuristic of its own); each config also carries the schedule id, which
:func:`humming.forward.humming_forward` launches, so routing and kernel always agree.

``use_batch_invariant`` (``VLLM_BATCH_INVARIANT=1``): the rows are one row, chord's
``batch_invariant`` policy: one schedule for the layer whatever the batch, without split-K, so a
row's output bits do not depend on the other rows of its batch. Refused: ``use_f16_accum``
(``VLLM_HUMMING_USE_F16_ACCUM=1``; Chord accumulates in fp32).
"""
from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any

from chord import checks

from humming import _chord
from humming.config import GemmType, LayerConfig
from humming.errors import ChordUnsupportedError

__all__ = ["get_heuristics_config", "family_for", "check_compute_flags"]

_FAMILY = {
    GemmType.INDEXED: "indexed",
    GemmType.GROUPED_CONTIGUOUS: "grouped_contiguous",
    GemmType.GROUPED_MASKED: "grouped_masked",
    GemmType.DENSE: "grouped_contiguous",  # a dense layer runs as one expert of the contiguous family
}
MAX_ROWS = 2**31 - 1


def _gemm_type(gemm_type: Any) -> GemmType:
    if isinstance(gemm_type, GemmType):
        return gemm_type
    if gemm_type is None:
        return GemmType.DENSE
    value = getattr(gemm_type, "value", gemm_type)
    try:
        return GemmType(str(value).lower())
    except ValueError:
        raise ValueError(f"gemm_type must be one of {[g.value for g in GemmType]}, got {gemm_type!r}") from None


def family_for(gemm_type: Any, layer_config: "LayerConfig | int") -> str:
    """Chord kernel family of a gemm_type for a layer (or its num_experts: 0 = dense)."""
    gt = _gemm_type(gemm_type)
    num_experts = layer_config if isinstance(layer_config, int) else layer_config.num_experts
    if gt is GemmType.DENSE and num_experts:
        raise ValueError(f"gemm_type 'dense' for an MoE layer of {num_experts} experts")
    if gt is not GemmType.DENSE and not num_experts:
        raise ValueError(f"gemm_type {gt.value!r} needs an MoE layer (LayerConfig.num_experts > 0)")
    return _FAMILY[gt]


def check_compute_flags(use_f16_accum: Any = False, use_batch_invariant: Any = False) -> bool:
    """Refuses what Chord does not compute; returns whether batch-invariant mode is asked for."""
    for name, v in (("use_f16_accum", use_f16_accum), ("use_batch_invariant", use_batch_invariant)):
        if not (isinstance(v, bool) or checks.is_int(v) and v in (0, 1)):  # JSON configs may carry 0/1
            checks.fail("get_heuristics_config", name, "be a bool (or 0/1)", repr(v), TypeError)
    if use_f16_accum:
        raise ChordUnsupportedError(
            "FP16 accumulation (VLLM_HUMMING_USE_F16_ACCUM=1 / use_f16_accum=True)",
            "Chord's kernels accumulate in fp32; unset VLLM_HUMMING_USE_F16_ACCUM.")
    return bool(use_batch_invariant)


def _config_row(schedule) -> dict[str, Any]:
    d = _chord.schedule_as_dict(schedule)
    return {
        "block_shape": [d["block_m"], d["block_n"], 64],
        "schedule": d["id"],
        "family": d["family"],
        "num_warps": d["warps"],
        "num_stages": d["stages"],
        "ctas_per_sm": d["ctas_per_sm"],
    }


def _rows(layer_config: LayerConfig, family: str, batch_invariant: bool = False
          ) -> tuple[tuple[int, int, dict[str, Any]], ...]:
    _check_role(layer_config)
    return rows_for(family, layer_config.kernel_experts, layer_config.shape_n, layer_config.shape_k, batch_invariant,
                    deployment=layer_config.chord_deployment or None, role=layer_config.chord_role)


def _check_role(layer_config: LayerConfig) -> None:
    """A layer made for one serving role is refused by a process of another (CHORD_ROLE), before
    any launch: its tuning rows were chosen for the role it was loaded under."""
    from chord.deployments import current_role

    now = current_role()
    if layer_config.chord_role != now:
        raise ValueError(f"get_heuristics_config: this layer was loaded for role {layer_config.chord_role!r} but "
                         f"CHORD_ROLE is {now!r} now; load the weights again under this role (or set CHORD_ROLE="
                         f"{layer_config.chord_role})")


def rows_for(family: str, num_experts: int, shape_n: int, shape_k: int, batch_invariant: bool = False, *,
             deployment: str | None = None, role: str | None = None) -> tuple[tuple[int, int, dict[str, Any]], ...]:
    """The rows of a layer with `num_experts` (packed) experts of padded size shape_n x shape_k,
    under chord's current selection policy ($CHORD_POLICY), or its batch-invariant policy (one row),
    for its deployment (default: by shape) and role (default: CHORD_ROLE)."""
    return _rows_for(family, num_experts, shape_n, shape_k, "batch_invariant" if batch_invariant
                     else _chord.policy_name(), deployment, role)


@lru_cache(maxsize=1024)
def _rows_for(family: str, num_experts: int, shape_n: int, shape_k: int, policy: str,
              deployment: str | None = None, role: str | None = None):
    table = _chord.schedule_rows(family, num_experts, shape_n, shape_k, policy=policy, deployment=deployment,
                                 role=role)
    rows = []
    for i, (lo, hi, schedule) in enumerate(table):
        # the first row also takes valid_shape_m == 0 (vLLM matches min < m <= max)
        rows.append((-1 if i == 0 else int(lo), int(hi), _config_row(schedule)))
    if not rows or rows[-1][1] < MAX_ROWS:
        raise AssertionError(f"chord.schedule returned no rows up to {MAX_ROWS} for {family}: {table}")
    return tuple(rows)


def get_heuristics_config(
    layer_config: LayerConfig | dict,
    shape_m: int | None = None,
    use_f16_accum: bool = False,
    use_batch_invariant: bool = False,
    use_m_major_input_scale: bool = False,
    gemm_type: Any = "dense",
    device: Any = None,
):
    """Rows ``[(min_m, max_m, config), ...]`` covering every M, or the one config for ``shape_m``.

    ``config["block_shape"] = [block_m, block_n, 64]`` and ``config["schedule"]`` is the Chord
    schedule id for that range of routed rows. The rows call (``shape_m`` None, once per layer at
    init) also reserves the split-K workspaces of the rows on ``device`` (default: the current
    CUDA device; none without one): humming._chord.reserve_workspaces.
    """
    invariant = check_compute_flags(use_f16_accum, use_batch_invariant)
    if isinstance(layer_config, dict):
        layer_config = LayerConfig.from_dict(layer_config, "get_heuristics_config: layer_config")
    if not isinstance(layer_config, LayerConfig):
        raise TypeError(f"layer_config must be a humming LayerConfig, got {type(layer_config).__name__}")
    rows = _rows(layer_config, family_for(gemm_type, layer_config), invariant)
    if shape_m is None:  # once per layer at init: the split rows' workspaces are sized here
        _reserve(rows, layer_config, device)
        return [(lo, hi, copy.deepcopy(cfg)) for lo, hi, cfg in rows]
    return copy.deepcopy(row_for(rows, int(shape_m)))


def _reserve(rows, layer_config: LayerConfig, device) -> None:
    """The workspaces of the rows closed above (max_m < MAX_ROWS). Left to grow on first need,
    bounded in chord.ops: the open last row, and the masked family, whose rows per expert are not
    known here."""
    closed = [(cfg["schedule"], hi) for _, hi, cfg in rows if hi < MAX_ROWS and cfg["family"] != "grouped_masked"]
    _chord.reserve_workspaces(closed, layer_config.shape_n, layer_config.kernel_experts, device)


def row_for(rows, shape_m: int) -> dict[str, Any]:
    """The config of the row vLLM would pick for ``shape_m`` (``min < shape_m <= max``)."""
    for lo, hi, cfg in rows:
        if lo < shape_m <= hi:
            return cfg
    return rows[0][2] if shape_m <= rows[0][0] else rows[-1][2]
