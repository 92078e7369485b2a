"""Schedules (every kernel knob), problems (host-known shape integers) and the selection policy.

This is the one place where a shape becomes a kernel choice. ``select(profile, problem)`` is a
pure function of host integers (it never reads a device tensor, so it never syncs and is safe
under CUDA-graph capture), memoized per (profile, problem).

Profiles (``profiles/<gpu>.json``) hold one entry per deployment (``ep8-prefill``,
``ep8-decode``, ``tp8``), each a list of rules per family ordered by
``max_rows_per_expert``; the first rule whose bound covers the problem's expected rows per
expert gives the schedule, which is then fitted to N (block_n must divide N).

Without profile rows (``CHORD_POLICY=heuristic``, or ``select(..., policy="heuristic")``) the
heuristic's selection rules decide alone (block_m from rows per expert, wave-aware BN, the
split-K gate, the touched-experts estimate, raster on wgmma tiles, buffered-K for grouped
decode; ``POLICY_RULES``), each of which can be switched off for its ablation.

The names live in three modules, re-exported here: :mod:`chord.knobs` (``KNOBS``, ``Schedule``,
``Problem``), :mod:`chord.profiles` (profile files, rules and their fitting) and
:mod:`chord.selection` (policies, the heuristic, ``explain`` / ``select`` / ``schedule_table``).
"""
from __future__ import annotations

from chord.knobs import (FAMILIES, K_BLOCK, KNOB, KNOBS, MAINLOOPS, MAX_SMEM_PER_CTA, WGMMA_BLOCK_MS,
                         WGMMA_BUILT_OTHER_REGS, WGMMA_OTHER_REGS, Knob, Problem, Schedule,
                         _check_family, _FAMILY_TAG, _ID_RE, _id_part, _parse_id, _TAG_FAMILY, as_dict, override,
                         pairs_fit, wgmma_operand_regs, wgmma_producer_regs)
from chord.profiles import (_ENTRY_FIELDS, EP8_DECODE_MAX_ROWS_PER_EXPERT, Decision, Profile, ProfileFile, Rule,
                            _fit_n_tiles, _fit_schedule, _is_number, _legal_text, _parse_rule, _profile_path,
                            _rule_for, gpu_profile_name, iter_schedules, load_profile, load_profile_file)
from chord.deployments import default_deployment, profile_for
from chord.selection import (_ROW_GRID, BATCH_INVARIANT_ROWS_PER_EXPERT, BUFFERED_K_ELEMS, DECODE_STREAM_MIN_K_BLOCKS,
                             DECODE_STREAM_MIN_N, DECODE_STREAM_STAGES, GROUPED_TMA_MIN_BLOCK_M, POLICY_RULES,
                             POLICY_SOURCES, SHORT_K_BLOCKS, SMEM_PER_SM, SMS_H200, SPLIT_FILL_MAX,
                             SPLIT_FILL_MIN_K_BLOCKS, WGMMA_MIN_ROWS_PER_EXPERT, WIDE_TILE_MAX_BLOCK_M,
                             WIDE_WGMMA_MIN_ROWS_PER_EXPERT, Policy, _batch_invariant_decision, _explain,
                             _explain_rules, _fitted, _heuristic_decision, _heuristic_rows, _heuristic_table,
                             _parse_policy_text, _refit, _wide_tile, current_policy, explain, parse_policy,
                             schedule_table, select, token_tiles, touched_experts, waves)

__all__ = [
    "FAMILIES", "K_BLOCK", "KNOB", "KNOBS", "MAINLOOPS", "MAX_SMEM_PER_CTA", "WGMMA_BLOCK_MS", "WGMMA_BUILT_OTHER_REGS",
    "WGMMA_OTHER_REGS", "Knob", "Problem", "Schedule", "as_dict", "override", "pairs_fit",
    "wgmma_operand_regs", "wgmma_producer_regs",
    "EP8_DECODE_MAX_ROWS_PER_EXPERT", "Decision", "Profile", "ProfileFile", "Rule", "default_deployment",
    "gpu_profile_name", "iter_schedules", "load_profile", "load_profile_file", "profile_for",
    "BATCH_INVARIANT_ROWS_PER_EXPERT", "BUFFERED_K_ELEMS", "DECODE_STREAM_MIN_K_BLOCKS", "DECODE_STREAM_MIN_N",
    "DECODE_STREAM_STAGES", "GROUPED_TMA_MIN_BLOCK_M", "POLICY_RULES", "POLICY_SOURCES", "SHORT_K_BLOCKS",
    "SMEM_PER_SM", "SMS_H200", "SPLIT_FILL_MAX", "SPLIT_FILL_MIN_K_BLOCKS", "WGMMA_MIN_ROWS_PER_EXPERT",
    "WIDE_TILE_MAX_BLOCK_M", "WIDE_WGMMA_MIN_ROWS_PER_EXPERT", "Policy", "current_policy", "explain", "parse_policy",
    "schedule_table", "select", "token_tiles", "touched_experts", "waves",
]
