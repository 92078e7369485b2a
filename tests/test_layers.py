"""The kernel library core never imports the lab that measures it (docs/architecture.md, "Core and
lab"): checked from the source (every import statement, lazy ones inside functions included) and
at run time (importing chord.ops and the humming root loads no lab module). Every module of the
package is on one side, so a new module has to choose."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the kernel library: what serving imports (chord.ops, the humming root) and what it needs
CORE = {
    "chord", "chord._env", "chord._resources", "chord.checks", "chord.cost", "chord.deployments", "chord.formats",
    "chord.jit", "chord.knobs", "chord.launch", "chord.ops", "chord.optimizations", "chord.profiles",
    "chord.profiling", "chord.reference", "chord.routing", "chord.schedule", "chord.selection", "chord.testing",
}
#: the lab: measures, tunes, shows and reports on the core, and the command line over both
LAB = {"chord._args", "chord.bench", "chord.capture", "chord.cli", "chord.doctor", "chord.limits", "chord.precompile",
       "chord.timeline", "chord.tune", "chord.variant", "chord.workbench"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _side(name: str) -> str | None:
    for side, names in (("lab", LAB), ("core", CORE)):
        if any(name == n or name.startswith(n + ".") for n in names if n != "chord"):
            return side
    return "core" if name == "chord" else None


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_every_chord_module_is_core_or_lab():
    unplaced = [_module_name(p) for p in (ROOT / "chord").rglob("*.py") if _side(_module_name(p)) is None]
    assert not unplaced, f"modules on neither side (add them to CORE or LAB in this test): {unplaced}"


def test_core_and_humming_never_import_the_lab():
    paths = [p for p in (ROOT / "chord").rglob("*.py") if _side(_module_name(p)) == "core"]
    paths += list((ROOT / "humming").rglob("*.py"))
    bad = [f"{p.relative_to(ROOT)} imports {m}" for p in paths for m in sorted(_imports(p))
           if m.startswith("chord") and _side(m) == "lab"]
    assert not bad, "\n".join(bad)


def test_serving_imports_load_no_lab_module():
    code = ("import sys, chord.ops, humming, humming.forward, humming.tune, humming.transform, humming.layer\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('chord'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = out.stdout.split()
    assert "chord.ops" in loaded
    assert not [m for m in loaded if _side(m) == "lab"], loaded
