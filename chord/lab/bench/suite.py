"""Benchmark suites: load a suite JSON and pick scenarios by id and family.

A suite (``chord/lab/bench/suites/kimi_k2_h200.json``) lists per-GPU MoE GEMM scenarios. Each one
fixes a deployment (EP8: 48 local experts; TP8: 384 experts with I/8 per rank), the gate_up and
down shapes, and the load: ``tok_e`` (rows per local expert, EP8) or ``tokens`` (TP8), plus the
kernel families it is measured with.

Derived numbers (the ones every other bench module uses):

* ``m``     -- tokens of the call: EP8 ``tok_e * experts / top_k``; TP8 ``tokens``
* ``rows``  -- routed rows ``m * top_k`` (= vLLM's ``valid_shape_m`` for this GPU)
* ``rows_per_expert`` -- ``rows / experts`` (what decides a schedule)
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Iterable, Sequence

FAMILIES = ("indexed", "grouped_contiguous", "grouped_masked")
DEPLOYMENTS = ("EP8", "EP16", "EP32", "TP8")  # the suites' deployments; `chord tune` may name others
_DEPLOYMENT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
SUITES_DIR = Path(__file__).resolve().parent / "suites"
BASELINES_DIR = Path(__file__).resolve().parent / "baselines"
DEFAULT_SUITE = SUITES_DIR / "kimi_k2_h200.json"
DEFAULT_BASELINE = BASELINES_DIR / "humming-0.1.20-h200.json"


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One per-GPU MoE shape and load; ``families`` are the kernel families it is run with."""

    id: str
    deployment: str  # "EP8" | "EP16" | "EP32" | "TP8" | "custom"
    experts: int
    n_gate_up: int
    k_gate_up: int
    n_down: int
    k_down: int
    top_k: int = 8
    tok_e: int | None = None  # EP8: rows per local expert (balanced routing)
    tokens: int | None = None  # TP8: tokens of the call
    families: tuple[str, ...] = FAMILIES

    def __post_init__(self) -> None:
        if not isinstance(self.deployment, str) or not _DEPLOYMENT_RE.match(self.deployment):
            raise ValueError(f"scenario {self.id!r}: deployment must be a name such as {', '.join(DEPLOYMENTS)} "
                             f"(letters, digits, '_'), got {self.deployment!r}")
        for name in ("experts", "n_gate_up", "k_gate_up", "n_down", "k_down", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"scenario {self.id!r}: {name} must be a positive int, got {v!r}")
        if (self.tok_e is None) == (self.tokens is None):
            raise ValueError(f"scenario {self.id!r}: give exactly one of tok_e (EP8) or tokens (TP8)")
        if self.tok_e is not None and (self.tok_e * self.experts) % self.top_k:
            raise ValueError(f"scenario {self.id!r}: tok_e*experts = {self.tok_e * self.experts} is not a "
                             f"multiple of top_k={self.top_k}, so no balanced routing exists")
        if self.top_k > self.experts:
            raise ValueError(f"scenario {self.id!r}: top_k={self.top_k} > experts={self.experts}")
        bad = [f for f in self.families if f not in FAMILIES]
        if bad:
            raise ValueError(f"scenario {self.id!r}: unknown families {bad}; known: {FAMILIES}")

    @property
    def m(self) -> int:
        """Tokens of the call."""
        if self.tok_e is not None:
            return self.tok_e * self.experts // self.top_k
        return int(self.tokens)  # type: ignore[arg-type]

    @property
    def rows(self) -> int:
        """Routed rows (M * top_k): vLLM's ``valid_shape_m`` for this GPU."""
        return self.m * self.top_k

    @property
    def rows_per_expert(self) -> float:
        return self.rows / self.experts

    @property
    def balanced(self) -> bool:
        """EP8 routing gives every local expert exactly ``tok_e`` rows."""
        return self.tok_e is not None

    @property
    def role(self) -> str:
        """The serving role whose rules this scenario is measured under (chord.deployments): a
        ``decode`` or ``prefill`` scenario id says which; a load given in tokens (TP8) serves both."""
        if self.tokens is not None:
            return "both"
        return "decode" if "decode" in self.id else "prefill"

    @property
    def profile_deployment(self) -> str:
        """A short label of the deployment and role this scenario runs under (``ep16-decode``,
        ``tp8``); the rules come from :meth:`profile`."""
        d = self.deployment.lower()
        return d if self.role == "both" else f"{d}-{self.role}"

    def profile(self, profile_file: str | None = None, family: str | None = None):
        """The chord.schedule.Profile that decides this scenario's GEMMs: the profile's deployment
        that covers its weight shape (chord.deployments; ``custom`` and the heuristic policy when
        none does), under the scenario's role."""
        from chord.deployments import profile_for

        return profile_for(family or self.families[0], self.experts, self.n_gate_up, self.k_gate_up,
                           role=self.role, profile_name=profile_file)

    @property
    def weights_key(self) -> tuple:
        """Scenarios with the same key share one set of expert weights (built once)."""
        return (self.deployment, self.experts, self.n_gate_up, self.k_gate_up, self.n_down, self.k_down)

    def gemm_problem(self, family: str, gemm: str):
        """(n, k, chord.schedule.Problem) of this scenario's `gemm` ("gate_up" or "down") in
        `family`: gate_up reads the routed rows with the routing's top_k (indexed), down reads one
        row per route. A family the scenario does not run, or another gemm name, is refused."""
        from chord.schedule import Problem

        if gemm not in ("gate_up", "down"):
            raise ValueError(f"scenario {self.id}: gemm must be 'gate_up' or 'down', got {gemm!r}")
        if family not in self.families:
            raise ValueError(f"scenario {self.id} runs families {self.families}, got {family!r}")
        n, k, top_k = (self.n_gate_up, self.k_gate_up, self.top_k) if gemm == "gate_up" else (self.n_down, self.k_down, 1)
        return n, k, Problem(family, self.experts, n, k, self.rows, top_k if family == "indexed" else 1)

    def label(self) -> str:
        load = f"tok_e={self.tok_e}, " if self.tok_e is not None else ""
        return f"{self.id} ({self.deployment}, {load}M={self.m}, rows={self.rows})"

    def scaled(self, new_id: str, *, experts: int, n_gate_up: int, k_gate_up: int, top_k: int,
               tok_e: int | None = None, tokens: int | None = None) -> "Scenario":
        """A smaller copy with Kimi's structure (down = [N = k_gate_up, K = n_gate_up / 2]), for CPU runs."""
        return dataclasses.replace(self, id=new_id, experts=experts, n_gate_up=n_gate_up, k_gate_up=k_gate_up,
                                   n_down=k_gate_up, k_down=n_gate_up // 2, top_k=top_k, tok_e=tok_e, tokens=tokens)


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    about: str
    model: dict
    routing: dict
    scenarios: tuple[Scenario, ...]
    path: str = ""

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self.scenarios]

    def scenario(self, scenario_id: str) -> Scenario:
        for s in self.scenarios:
            if s.id == scenario_id:
                return s
        raise ValueError(f"unknown scenario {scenario_id!r} in suite {self.name!r}; known: {', '.join(self.ids)}")

    def select(self, ids: Iterable[str] | str | None = None,
               families: Iterable[str] | str | None = None) -> list[tuple[Scenario, tuple[str, ...]]]:
        """``[(scenario, families to run)]`` in suite order.

        ``ids``/``families``: None (all), a comma-separated string or an iterable. Unknown ids or
        families raise ``ValueError``; scenarios left with no family after the filter are dropped.
        """
        want_ids = _split(ids)
        want_fam = _split(families)
        if want_ids is not None:
            for i in want_ids:
                self.scenario(i)  # raises on unknown ids
        if want_fam is not None:
            bad = [f for f in want_fam if f not in FAMILIES]
            if bad:
                raise ValueError(f"unknown families {bad}; known: {', '.join(FAMILIES)}")
        out = []
        for s in self.scenarios:
            if want_ids is not None and s.id not in want_ids:
                continue
            fams = tuple(f for f in s.families if want_fam is None or f in want_fam)
            if fams:
                out.append((s, fams))
        return out


def _split(v: Iterable[str] | str | None) -> list[str] | None:
    if v is None:
        return None
    if isinstance(v, str):
        items = [x.strip() for x in v.split(",")]
    else:
        items = [str(x).strip() for x in v]
    items = [x for x in items if x]
    return items or None


def scenario_from_dict(d: dict, top_k: int) -> Scenario:
    known = {f.name for f in dataclasses.fields(Scenario)}
    extra = sorted(set(d) - known)
    if extra:
        raise ValueError(f"scenario {d.get('id')!r}: unknown keys {extra}")
    kw = dict(d)
    kw.setdefault("top_k", top_k)
    kw["families"] = tuple(kw.get("families", FAMILIES))
    return Scenario(**kw)


def recorded_path(path: str | Path, base: str | Path | None = None) -> str:
    """How a result file names a file it read: one inside the chord package by its path from the
    package's parent (e.g. the packaged EP8 suite: ``chord/lab/bench/suites/kimi_k2_h200.json``),
    one under ``base`` by its path relative to ``base``, anything else as given. Result files are shared and committed: the folders of the
    machine that wrote them stay out."""
    p = Path(path).resolve()
    for root in (SUITES_DIR.parents[3], Path(base).resolve() if base is not None else None):
        if root is not None and p.is_relative_to(root):
            return p.relative_to(root).as_posix()
    return str(path)


def load_suite(path: str | Path | None = None) -> Suite:
    """Load a suite JSON (default: the packaged Kimi K2 / H200 suite)."""
    p = Path(path) if path is not None else DEFAULT_SUITE
    if not p.exists() and path is not None and (SUITES_DIR / f"{path}.json").exists():
        p = SUITES_DIR / f"{path}.json"
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"suite file {str(p)!r} not found (packaged suites: "
                         f"{', '.join(x.stem for x in SUITES_DIR.glob('*.json'))})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"suite file {str(p)!r}: not valid JSON ({exc}); a suite is an object with 'scenarios'")\
            from None
    if not isinstance(data, dict) or not isinstance(data.get("scenarios"), list):
        raise ValueError(f"suite file {str(p)!r} must be a JSON object with a 'scenarios' list, got "
                         f"{type(data).__name__}")
    model = data.get("model", {})
    top_k = int(model.get("top_k", 8))
    scenarios = tuple(scenario_from_dict(s, top_k) for s in data["scenarios"])
    ids = [s.id for s in scenarios]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"suite {p}: duplicate scenario ids {dup}")
    return Suite(data.get("name", p.stem), data.get("about", ""), model, data.get("routing", {}), scenarios, str(p))


def cpu_scenarios() -> list[Scenario]:
    """Scaled-down EP8 decode and prefill scenarios (Kimi structure, tiny shapes) for CPU runs.

    8 local experts, top-4, gate_up [8, 256, 512], down [8, 512, 128]: the float32 reference
    path runs in well under a second per family on a laptop CPU.
    """
    base = Scenario(id="cpu", deployment="EP8", experts=48, n_gate_up=4096, k_gate_up=7168,
                    n_down=7168, k_down=2048, tok_e=1)
    dec = base.scaled("cpu-ep8-decode-tok2", experts=8, n_gate_up=256, k_gate_up=512, tok_e=2, top_k=4)
    pre = base.scaled("cpu-ep8-prefill-tok24", experts=8, n_gate_up=256, k_gate_up=512, tok_e=24, top_k=4)
    return [dataclasses.replace(dec, families=("indexed", "grouped_masked")),
            dataclasses.replace(pre, families=("indexed", "grouped_contiguous"))]


Selection = Sequence[tuple[Scenario, tuple[str, ...]]]


def scenarios_by_weights(selected: Selection) -> list[list[tuple[Scenario, tuple[str, ...]]]]:
    """Group a selection by shared weights (one weight build per group), keeping suite order."""
    groups: dict[tuple, list] = {}
    for item in selected:
        groups.setdefault(item[0].weights_key, []).append(item)
    return list(groups.values())


def shape_suite(name: str, experts: int, n_gate_up: int, k_gate_up: int, n_down: int, k_down: int, *,
                tok_e: Sequence[int] | None = None, tokens: Sequence[int] | None = None, top_k: int = 8,
                families: Sequence[str] | None = None, split_rows_per_expert: float = 45.255) -> Suite:
    """A suite of one layer shape at several loads (what `chord tune --experts ...` tunes): with
    `tok_e`, one scenario per rows-per-expert point, ``<name>-decode-tok<t>`` up to
    `split_rows_per_expert` (families indexed + grouped_masked) and ``<name>-prefill-tok<t>`` above
    (indexed + grouped_contiguous); with `tokens`, ``<name>-m<T>`` (indexed). `families` narrows
    the families."""
    if (tok_e is None) == (tokens is None):
        raise ValueError("shape_suite: give exactly one of tok_e (rows per expert) or tokens")
    loads = list(tok_e if tok_e is not None else tokens)
    if not loads or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in loads):
        raise ValueError(f"shape_suite: {'tok_e' if tok_e is not None else 'tokens'} must be positive ints, "
                         f"got {loads!r}")
    if len(set(loads)) != len(loads):
        raise ValueError(f"shape_suite: repeated loads in {loads!r}")
    want = _split(families)
    if want is not None:
        bad = [f for f in want if f not in FAMILIES]
        if bad:
            raise ValueError(f"unknown families {bad}; known: {', '.join(FAMILIES)}")
    dep = name.upper()
    base = name.lower()
    scenarios = []
    for v in sorted(loads):
        if tok_e is not None:
            decode = v <= split_rows_per_expert
            sid = f"{base}-{'decode' if decode else 'prefill'}-tok{v}"
            fams = ("indexed", "grouped_masked") if decode else ("indexed", "grouped_contiguous")
            kw = {"tok_e": v}
        else:
            sid, fams, kw = f"{base}-m{v}", ("indexed",), {"tokens": v}
        fams = tuple(f for f in fams if want is None or f in want) or tuple(want or fams)
        scenarios.append(Scenario(id=sid, deployment=dep, experts=experts, n_gate_up=n_gate_up, k_gate_up=k_gate_up,
                                  n_down=n_down, k_down=k_down, top_k=top_k, families=fams, **kw))
    return Suite(base, f"{dep}: {experts} experts, gate_up [{n_gate_up}, {k_gate_up}], down [{n_down}, {k_down}]",
                 {"top_k": top_k}, {}, tuple(scenarios), "")
