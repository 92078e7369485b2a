"""tools/profile_variant.py: a profile with knobs set on every rule, checked before it is written."""
import importlib.util
import json
from pathlib import Path

import pytest

from chord.schedule import load_profile_file, override

_spec = importlib.util.spec_from_file_location("profile_variant", Path(__file__).parents[1] / "tools" / "profile_variant.py")
pv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pv)


def test_every_rule_gets_the_knob_and_the_rest_is_unchanged(tmp_path):
    out = tmp_path / "v.json"
    assert pv.main(["--set", "pdl=1", "--out", str(out)]) == 0
    base, var = load_profile_file("h200"), load_profile_file(str(out))
    b = sorted(s.id for s in base.all_schedules())
    v = sorted(s.id for s in var.all_schedules())
    assert len(b) == len(v) and all(s.pdl == 1 for s in var.all_schedules())
    assert sorted(override(s, pdl=0).id for s in var.all_schedules()) == b
    data = json.loads(out.read_text())
    rule = next(iter(next(iter(data["deployments"].values()))["families"].values()))[0]
    assert rule["why"].startswith("variant (pdl=1")


def test_a_knob_goes_only_where_it_applies(tmp_path):
    """fold applies to the mma loop with the operand swap: wgmma rules stay as they are."""
    out = tmp_path / "v.json"
    assert pv.main(["--set", "fold=1", "--out", str(out)]) == 0
    base, var = load_profile_file("h200"), load_profile_file(str(out))
    folded = [s for s in var.all_schedules() if s.mainloop == "mma"]
    assert folded and all(s.fold == 1 for s in folded)
    assert all(s.fold == 0 for s in var.all_schedules() if s.mainloop == "wgmma")
    assert (sorted(s.id for s in base.all_schedules() if s.mainloop == "wgmma")
            == sorted(s.id for s in var.all_schedules() if s.mainloop == "wgmma"))
    rules = [r for d in json.loads(out.read_text())["deployments"].values() for rs in d["families"].values() for r in rs]
    assert any("fold does not apply here" in r["why"] for r in rules)
    assert any(r["why"].startswith("variant (fold=1,") for r in rules)


@pytest.mark.parametrize("item,match", [("pdl=2", "must be one of 0, 1"), ("nope=1", "expected <knob>=<value>"),
                                        ("block_n=128", "tile shape knob"), ("pdl", "expected <knob>=<value>")])
def test_bad_sets_are_refused_by_name(item, match, tmp_path, capsys):
    assert pv.main(["--set", item, "--out", str(tmp_path / "v.json")]) == 2
    assert match in capsys.readouterr().err and not (tmp_path / "v.json").exists()
