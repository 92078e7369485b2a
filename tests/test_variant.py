"""`chord variant`: a profile with knobs set on every rule, checked before it is written; and
tools/profile_variant.py forwarding to it."""
import json

import pytest
from conftest import load_tool

from chord import cli
from chord.schedule import load_profile_file, override


def test_every_rule_gets_the_knob_and_the_rest_is_unchanged(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert cli.main(["variant", "--set", "pdl=1", "--out", str(out), "--profile", "h200"]) == 0
    assert f"-> {out}" in capsys.readouterr().out
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
    assert cli.main(["variant", "--set", "fold=1", "--out", str(out), "--profile", "h200"]) == 0
    base, var = load_profile_file("h200"), load_profile_file(str(out))
    folded = [s for s in var.all_schedules() if s.mainloop == "mma"]
    assert folded and all(s.fold == 1 for s in folded)
    assert all(s.fold == 0 for s in var.all_schedules() if s.mainloop == "wgmma")
    assert (sorted(s.id for s in base.all_schedules() if s.mainloop == "wgmma")
            == sorted(s.id for s in var.all_schedules() if s.mainloop == "wgmma"))
    rules = [r for d in json.loads(out.read_text())["deployments"].values() for rs in d["families"].values() for r in rs]
    assert any("fold does not apply here" in r["why"] for r in rules)
    assert any(r["why"].startswith("variant (fold=1,") for r in rules)


def test_a_knob_may_require_one_set_before_it(tmp_path):
    """pdl_prefetch applies only with pdl=1: set after it, every rule gets both; alone, no rule
    changes and each rule says why."""
    both, alone = tmp_path / "both.json", tmp_path / "alone.json"
    assert cli.main(["variant", "--set", "pdl=1", "--set", "pdl_prefetch=1", "--out", str(both)]) == 0
    var = load_profile_file(str(both)).all_schedules()
    assert var and all(s.pdl == 1 and s.pdl_prefetch == 1 for s in var)
    assert cli.main(["variant", "--set", "pdl_prefetch=1", "--out", str(alone)]) == 0
    assert (sorted(s.id for s in load_profile_file(str(alone)).all_schedules())
            == sorted(s.id for s in load_profile_file("h200").all_schedules()))
    rules = [r for d in json.loads(alone.read_text())["deployments"].values() for rs in d["families"].values()
             for r in rs]
    assert rules and all("pdl_prefetch does not apply here" in r["why"] for r in rules)


@pytest.mark.parametrize("item,match", [("pdl=2", "must be one of 0, 1"), ("nope=1", "expected <knob>=<value>"),
                                        ("block_n=128", "tile shape knob"), ("pdl", "expected <knob>=<value>")])
def test_bad_sets_are_refused_by_name(item, match, tmp_path, capsys):
    assert cli.main(["variant", "--set", item, "--out", str(tmp_path / "v.json")]) == 2
    err = capsys.readouterr().err
    assert f"--set {item!r}" in err and match in err and not (tmp_path / "v.json").exists()


def test_bad_out_and_profile_are_refused_by_name(tmp_path, capsys):
    for argv, named in ((["--out", str(tmp_path / "v.txt")], "must name a .json file"),
                        (["--out", str(tmp_path)], "--out"),
                        (["--out", str(tmp_path / "v.json"), "--profile", "no-such-gpu"], "--profile 'no-such-gpu'")):
        assert cli.main(["variant", "--set", "pdl=1", *argv]) == 2
        assert named in capsys.readouterr().err


def test_the_tool_forwards_to_chord_variant(tmp_path):
    tool = load_tool("profile_variant")
    assert tool.translate(["--set", "pdl=1", "--set", "fold=1", "--out", "v.json", "--profile", "h200"]) == [
        "variant", "--out", "v.json", "--set", "pdl=1", "--set", "fold=1", "--profile", "h200"]
    out = tmp_path / "v.json"
    assert tool.main(["--set", "pdl=1", "--out", str(out)]) == 0
    assert all(s.pdl == 1 for s in load_profile_file(str(out)).all_schedules())
    assert tool.main(["--set", "pdl=9", "--out", str(tmp_path / "w.json")]) == 2
