"""The kernel library core never imports the lab that measures it (docs/architecture.md, "Core and
lab"): the lab is the subpackage chord/lab, and nothing outside it imports it except the command's
entry chord/cli.py. Checked from the source (every import statement, lazy ones inside functions
included) and at run time (importing chord.ops and the humming root loads no lab module). Every
module outside chord/lab is listed as core here, so a new module has to choose its side; the lab's
earlier import paths (chord._moved) are aliases for users, never used inside the package."""
import ast
import subprocess
import sys
from pathlib import Path

from chord import _moved

ROOT = Path(__file__).resolve().parents[1]

#: the kernel library: what serving imports (chord.ops, the humming root) and what it needs
CORE = {
    "chord", "chord._env", "chord._moved", "chord._resources", "chord.checks", "chord.cost", "chord.deployments",
    "chord.formats", "chord.jit", "chord.knobs", "chord.launch", "chord.ops", "chord.optimizations", "chord.params",
    "chord.profiles",
    "chord.profiling", "chord.reference", "chord.routing", "chord.schedule", "chord.selection", "chord.testing",
}
#: the lab: the subpackage that measures, tunes, shows and reports on the core, and the command line
LAB = "chord.lab"
#: the one module outside the lab that may import it: the console script's entry
ENTRY = "chord.cli"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_lab(name: str) -> bool:
    return name == LAB or name.startswith(LAB + ".")


def _side(name: str) -> str | None:
    if _is_lab(name):
        return "lab"
    if name == ENTRY:
        return "entry"
    return "core" if name in CORE else None


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_every_chord_module_is_core_lab_or_the_entry():
    unplaced = [_module_name(p) for p in (ROOT / "chord").rglob("*.py") if _side(_module_name(p)) is None]
    assert not unplaced, f"modules on neither side (add them to CORE here, or move them into chord/lab): {unplaced}"
    assert (ROOT / "chord" / "lab" / "__init__.py").is_file() and (ROOT / "chord" / "cli.py").is_file()


def test_nothing_outside_the_lab_imports_it_but_the_entry():
    paths = [p for p in (ROOT / "chord").rglob("*.py") if _side(_module_name(p)) == "core"]
    paths += list((ROOT / "humming").rglob("*.py"))
    bad = [f"{p.relative_to(ROOT)} imports {m}" for p in paths for m in sorted(_imports(p))
           if _is_lab(m) or (m.startswith("chord") and _moved.new_name(m))]
    assert not bad, "\n".join(bad)
    entry = _imports(ROOT / "chord" / "cli.py")
    assert {m for m in entry if m.startswith("chord")} == {"chord.lab.cli", "chord.lab.cli.main",
                                                         "chord.lab.cli.build_parser"}, entry


def test_no_module_uses_the_old_lab_paths():
    """chord.bench, chord.workbench, chord.tune, ... are kept for users only: inside the package,
    the tests, the tools and the notebooks every import names chord.lab."""
    paths = [*(ROOT / "chord").rglob("*.py"), *(ROOT / "humming").rglob("*.py"), *(ROOT / "tools").glob("*.py"),
             *(ROOT / "notebooks").glob("*.py"), *(ROOT / "tests").rglob("*.py")]
    bad = [f"{p.relative_to(ROOT)} imports {m}" for p in paths if p.name != "test_moved.py"
           for m in sorted(_imports(p)) if _moved.new_name(m)]
    assert not bad, "\n".join(bad)


def test_serving_imports_load_no_lab_module():
    code = ("import sys, chord.ops, humming, humming.forward, humming.tune, humming.transform, humming.layer\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('chord'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = out.stdout.split()
    assert "chord.ops" in loaded
    assert not [m for m in loaded if _is_lab(m) or _moved.new_name(m)], loaded
