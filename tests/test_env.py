"""Environment switches parse one way everywhere (chord._env): typos raise, naming the variable."""
import pytest

from chord._env import flag, parse_flag

SWITCHES = ["CHORD_PTXAS_CHECK", "CHORD_DUMP_SASS", "CHORD_PRINT_SCHEDULES", "CHORD_NVTX", "CHORD_CHECK_ROUTING",
            "CHORD_HUMMING_CPU_REFERENCE"]


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "on", " On "])
def test_on_values(value):
    assert parse_flag("CHORD_NVTX", value) is True


@pytest.mark.parametrize("value", [None, "", "0", "false", "False", "no", "off", " OFF "])
def test_off_values(value):
    assert parse_flag("CHORD_NVTX", value) is False


@pytest.mark.parametrize("name", SWITCHES)
@pytest.mark.parametrize("value", ["2", "enable", "y", "-1"])
def test_other_values_raise_naming_the_variable(name, value, monkeypatch):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        flag(name)


def test_every_switch_is_read_through_the_parser():
    """No module compares a switch's raw string (the old `not in ("", "0")` read `false` as on)."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    for path in list((root / "chord").rglob("*.py")) + list((root / "humming").rglob("*.py")):
        text = path.read_text()
        for name in SWITCHES:
            assert f'os.environ.get("{name}"' not in text, f"{path} reads {name} without chord._env.flag"


def test_print_schedules_false_means_off(monkeypatch, capsys):
    from chord.schedule import Problem, _explain, explain

    monkeypatch.setenv("CHORD_PRINT_SCHEDULES", "false")
    _explain.cache_clear()
    explain("h200:ep8-prefill", Problem("indexed", 48, 4096, 7168, 48 * 64, 8))
    assert "[chord]" not in capsys.readouterr().out
    monkeypatch.setenv("CHORD_PRINT_SCHEDULES", "yes")
    _explain.cache_clear()
    explain("h200:ep8-prefill", Problem("indexed", 48, 4096, 7168, 48 * 65, 8))
    assert "[chord]" in capsys.readouterr().out
    _explain.cache_clear()
