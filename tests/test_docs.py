"""The docs tell users the truth: no reference to a file that does not exist, no internal
work-round terms (results are placed by date and commit), and the README's headline is the one
its command computes from the committed results file."""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "results" / "README.md", *(ROOT / "docs").glob("*.md")])
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py")) + [ROOT / "notebooks" / "jupytext.toml"]
SOURCES = sorted(p for d in ("chord", "humming", "tools") for p in (ROOT / d).rglob("*.py"))
PROFILES = sorted((ROOT / "profiles").glob("*.json"))  # their about / why texts are shown to users
RESULT_DIRS = (ROOT / "results", ROOT / "chord" / "data" / "results", ROOT / "chord" / "data" / "notebooks")

# internal terms of how the project was worked on, meaningless to a user
INTERNAL = [
    (re.compile(r"\bsessions?\b", re.I), "a work-round ('session'): say the date and commit"),
    (re.compile(r"device machine", re.I), "an internal machine name"),
    (re.compile(r"\bthe tool\b", re.I), "an internal tool: name the command"),
    (re.compile(r"/work/"), "a path outside the repository"),
    (re.compile(r"\.\./shared"), "a path outside the repository"),
    (re.compile(r"DESIGN\.md"), "a file the project does not have"),
]
PATH = re.compile(r"(?<![\w/.-])((?:chord|docs|notebooks|results|tools|tests|profiles|csrc|humming|share)/"
                  r"[\w./{},-]*\.(?:py|md|json|txt|csv|png|html|toml|cuh|c|h|sh))")
FRAGMENT = re.compile(r"`(-[\w{},.-]+\.(?:json|txt|md))`")  # `-timing-<commit>-x.json`: a results file's tail
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def expand(text: str) -> list[str]:
    """Brace alternatives: a{b,c}d -> abd, acd."""
    parts = re.split(r"\{([^{}]*)\}", text)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def lines_of(path: Path):
    for i, line in enumerate(path.read_text().splitlines(), 1):
        yield i, line


@pytest.mark.parametrize("path", DOCS + NOTEBOOKS + SOURCES + PROFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_internal_terms(path):
    bad = [f"{path.relative_to(ROOT)}:{i}: {why}: {line.strip()[:120]}"
           for i, line in lines_of(path) for rx, why in INTERNAL if rx.search(line)]
    assert not bad, "\n".join(bad)


def test_result_file_names_carry_no_work_round_numbers():
    names = [p.name for d in RESULT_DIRS for p in d.iterdir()]
    assert names
    bad = [n for n in names if re.search(r"session|(?:^|-)s\d+-", n, re.I)]
    assert not bad, bad


@pytest.mark.parametrize("path", DOCS + NOTEBOOKS + SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_referenced_file_exists(path):
    results = [p.name for d in RESULT_DIRS for p in d.iterdir()]
    missing = []
    for i, line in lines_of(path):
        for ref in PATH.findall(line):
            ref = ref.rstrip(".,")
            if any(ch in ref for ch in "<*") or "NN" in ref or (path.suffix == ".py" and "{" in ref):
                continue  # a placeholder, a glob, or an f-string's field
            for one in expand(ref):
                if not (ROOT / one).exists():
                    missing.append(f"{path.relative_to(ROOT)}:{i}: {one}")
        for frag in FRAGMENT.findall(line):
            for one in expand(frag):
                if not any(n.endswith(one) for n in results):
                    missing.append(f"{path.relative_to(ROOT)}:{i}: no results file ends with {one}")
        if path.suffix == ".md":
            for link in LINK.findall(line):
                if re.match(r"[a-z]+:", link):
                    continue
                if not (path.parent / link).exists():
                    missing.append(f"{path.relative_to(ROOT)}:{i}: link {link}")
    assert not missing, "\n".join(missing)


def test_readme_headline_is_what_its_command_computes():
    from chord.lab.bench import headline

    result, shown = headline.default_result()
    readme = (ROOT / "README.md").read_text()
    assert headline.block(result, shown) in readme, "run: python -m chord.lab.bench.headline --write README.md"
    assert shown.startswith("chord/data/results/") and (ROOT / shown).is_file()


def test_headline_numbers(tmp_path):
    """The geomean and the bands from the pivoted rows, and a run without Humming has none."""
    import json

    from chord.lab.bench import headline

    result, shown = headline.default_result()
    cells = headline.speedups(result)
    text = headline.markdown(result, shown)
    assert f"**{headline.geomean([c['speedup'] for c in cells]):.3f}x**" in text
    assert sum(1 for c in cells for _, pred in headline.BANDS if pred(c["scenario"])) == len(cells)
    committed = dict(result, meta=dict(result["meta"], humming={"live": False}))
    with pytest.raises(ValueError, match="no Humming run"):
        headline.markdown(committed, shown)
    f = tmp_path / "r.json"
    f.write_text(json.dumps(result))
    md = tmp_path / "README.md"
    md.write_text(f"intro\n{headline.BEGIN}\nold\n{headline.END}\nrest\n")
    assert headline.main(["--file", str(f), "--write", str(md)]) == 0
    assert md.read_text().startswith("intro\n" + headline.BEGIN) and "old" not in md.read_text()
    assert md.read_text().endswith(f"{headline.END}\nrest\n")
