"""The environment registry (chord._env.VARS) is the one reader of CHORD_* variables: every one the
code names is registered, no module reads or writes os.environ for one, parameters pass through
chord._env.override (never os.environ), and the README's table is the one the registry computes."""
from __future__ import annotations

import ast
import os
import re
import threading
from pathlib import Path

import pytest

from chord import _env

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("chord", "humming", "tools") for p in (ROOT / d).rglob("*.py"))
C_MACROS = {"CHORD_NO_L2_HINT", "CHORD_TILE_GROUP_LOG"}  # -D flags of the kernel build, not variables
NAME = re.compile(r"\bCHORD_[A-Z0-9_]*[A-Z0-9]\b")


def _chord_names(node: ast.AST, consts: dict[str, str]) -> list[str]:
    """CHORD_* names a subscript / call argument evaluates to (a literal or a module constant)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value.startswith("CHORD_") else []
    if isinstance(node, ast.Name) and node.id in consts:
        return [consts[node.id]]
    return []


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
            and node.value.id == "os") or (isinstance(node, ast.Name) and node.id == "environ")


def environ_uses(path: Path) -> list[str]:
    """'line: what' for each read or write of a CHORD_* variable through os.environ / os.getenv /
    os.putenv in `path`, and each loop over os.environ's keys (every CHORD_* one is a read)."""
    tree = ast.parse(path.read_text())
    consts = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
              and n.value.value.startswith("CHORD_") for t in n.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            found += [f"{node.lineno}: os.environ[{n}]" for n in _chord_names(node.slice, consts)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if _is_environ(f.value) and f.attr in ("get", "pop", "setdefault", "__getitem__", "__setitem__"):
                found += [f"{node.lineno}: os.environ.{f.attr}({n})" for a in node.args[:1]
                          for n in _chord_names(a, consts)]
            if isinstance(f.value, ast.Name) and f.value.id == "os" and f.attr in ("getenv", "putenv", "unsetenv"):
                found += [f"{node.lineno}: os.{f.attr}({n})" for a in node.args[:1] for n in _chord_names(a, consts)]
            if _is_environ(f.value) and f.attr == "update":
                found += [f"{node.lineno}: os.environ.update({k.arg})" for k in node.keywords
                          if k.arg and k.arg.startswith("CHORD_")]
        elif isinstance(node, ast.comprehension) and _is_environ(node.iter):
            found.append(f"{node.iter.lineno}: a loop over os.environ")
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            found += [f"{node.lineno}: {n} in os.environ" for n in _chord_names(node.left, consts)]
    return found


def test_the_check_finds_every_kind_of_direct_use(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('import os\nVAR = "CHORD_X"\nos.environ.get("CHORD_POLICY")\nos.environ["CHORD_A"] = "1"\n'
                   'os.environ.pop(VAR, None)\nos.environ.setdefault("CHORD_B", "1")\nos.putenv("CHORD_C", "1")\n'
                   'os.getenv("CHORD_D")\n"CHORD_E" in os.environ\n[k for k in os.environ]\nos.environ[VAR]\n'
                   'os.environ.get("HOME")\ndict(os.environ, CHORD_NVTX="1")\n')
    assert sorted(int(u.split(":")[0]) for u in environ_uses(bad)) == list(range(3, 12))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_but_the_registry_touches_os_environ_for_chord_names(path):
    if path == ROOT / "chord" / "_env.py":
        return
    assert environ_uses(path) == [], f"{path.relative_to(ROOT)}: read or write through chord._env instead"


def test_every_chord_name_in_the_code_is_registered():
    named = {m for p in SOURCES for m in NAME.findall(p.read_text())} - C_MACROS
    assert named - set(_env.VARS) == set(), "register these in chord._env.VARS"
    fuzz = (ROOT / "tests" / "gpu" / "test_fuzz_gpu.py").read_text()
    assert "CHORD_FUZZ_CASES" in fuzz and "os.environ" not in fuzz


def test_every_entry_is_complete():
    for v in _env.VARS.values():
        assert v.kind in _env.KINDS and v.when in _env.WHEN and len(v.doc) > 20, v.name
        assert (v.kind == "choice") <= bool(v.choices), v.name
        assert _env.parse(v.name, None) == v.default, v.name
    assert set(_env.SWITCHES) == {n for n, v in _env.VARS.items() if v.kind == "flag"}


def test_the_readme_table_is_the_registrys():
    text = (ROOT / "README.md").read_text()
    assert _env.render(text) == text, "run: python -m chord._env --write README.md"
    for name in _env.VARS:
        assert f"| `{name}" in text


def test_write_replaces_only_the_block(tmp_path, capsys):
    f = tmp_path / "README.md"
    f.write_text(f"head\n{_env.BEGIN}\nold table\n{_env.END}\ntail\n")
    assert _env.main(["--check", str(f)]) == 1
    assert _env.main(["--write", str(f)]) == 0
    assert f.read_text() == f"head\n{_env.BEGIN}\n{_env.table()}\n{_env.END}\ntail\n"
    assert _env.main(["--check", str(f)]) == 0
    f.write_text("no markers\n")
    with pytest.raises(ValueError, match="markers"):
        _env.main(["--write", str(f)])


@pytest.mark.parametrize("name,value,want", [
    ("CHORD_TILE_GROUP", "3", "one of 1, 2, 4, 8"), ("CHORD_TILE_GROUP", "x", "one of 1, 2, 4, 8"),
    ("CHORD_FUZZ_CASES", "0", "a positive integer"), ("CHORD_FUZZ_CASES", "many", "a positive integer"),
    ("CHORD_ROLE", "serve", "decode, prefill, both"), ("CHORD_FAST_LAUNCH", "maybe", "on"),
])
def test_bad_values_raise_naming_the_variable(monkeypatch, name, value, want):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name) as exc:
        _env.get(name)
    assert want in str(exc.value)


def test_values_parse(monkeypatch):
    monkeypatch.setenv("CHORD_ROLE", " Decode ")
    monkeypatch.setenv("CHORD_TILE_GROUP", "2")
    monkeypatch.setenv("CHORD_CACHE_DIR", "")
    monkeypatch.setenv("CHORD_FAST_LAUNCH", "off")
    monkeypatch.delenv("CHORD_CHECK_ROUTING", raising=False)
    assert _env.get("CHORD_ROLE") == "decode" and _env.tile_group_max() == 2
    assert _env.get("CHORD_CACHE_DIR") is None  # empty reads as unset
    assert _env.flag("CHORD_FAST_LAUNCH") is False and _env.flag("CHORD_CHECK_ROUTING") is True
    with pytest.raises(KeyError, match="CHORD_NOPE"):
        _env.get("CHORD_NOPE")


def test_override_wins_nests_restores_and_never_writes_the_environment(monkeypatch):
    monkeypatch.setenv("CHORD_POLICY", "profile")
    monkeypatch.delenv("CHORD_TILE_GROUP", raising=False)
    before = dict(os.environ)
    with _env.override(CHORD_POLICY="heuristic", CHORD_TILE_GROUP=1):
        assert _env.get("CHORD_POLICY") == "heuristic" and _env.tile_group_max() == 1
        seen = []
        t = threading.Thread(target=lambda: seen.append(_env.get("CHORD_POLICY")))  # process-wide
        t.start()
        t.join()
        assert seen == ["heuristic"]
        with _env.override(CHORD_POLICY=None):
            assert _env.get("CHORD_POLICY") == "profile" and not _env.is_set("CHORD_POLICY")  # reads as unset
            assert "CHORD_POLICY" not in _env.environ() and "CHORD_POLICY" not in _env.current()
        assert _env.environ()["CHORD_POLICY"] == "heuristic" and _env.current()["CHORD_TILE_GROUP"] == "1"
        assert dict(os.environ) == before
    assert _env.get("CHORD_POLICY") == "profile" and _env.tile_group_max() == 8


def test_override_checks_before_it_applies():
    with pytest.raises(ValueError, match="CHORD_TILE_GROUP"):
        with _env.override(CHORD_POLICY="heuristic", CHORD_TILE_GROUP=3):
            pass
    assert _env._overrides == {}  # nothing was applied
    with pytest.raises(KeyError, match="CHORD_NOPE"):
        with _env.override(CHORD_NOPE="1"):
            pass
    with pytest.raises(TypeError, match="CHORD_POLICY"):
        with _env.override(CHORD_POLICY=1.5):
            pass


def test_an_override_reaches_the_readers(monkeypatch):
    """chord.selection, chord.profiles and chord.jit see an override as they would the variable."""
    from chord import jit, profiles, selection

    monkeypatch.delenv("CHORD_POLICY", raising=False)
    with _env.override(CHORD_POLICY="heuristic,-wave_aware_bn", CHORD_PROFILE="h200-nofold",
                       CHORD_CACHE_DIR=Path("/nonexistent/cc")):
        assert selection.current_policy() == selection.parse_policy("heuristic,-wave_aware_bn")
        assert profiles.gpu_profile_name() == "h200-nofold"
        assert jit.cache_dir() == Path("/nonexistent/cc")
    assert selection.current_policy() == selection.parse_policy("profile")


def test_no_code_exports_a_parameter():
    """The old ways (chord bench --policy, tune.time_layouts, the device cache and host-time tools,
    now chord precompile --cache-dir and chord bench --host-time) wrote os.environ; the AST check
    above covers them, this names them so a regression reads clearly."""
    for rel in ("chord/cli.py", "chord/lab/cli.py", "chord/lab/tune.py", "chord/lab/precompile.py", "chord/lab/bench/host_time.py",
                "tools/device_cache.py", "tools/host_time.py"):
        assert environ_uses(ROOT / rel) == [], rel
