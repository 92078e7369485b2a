"""tools/host_time.py's command line on CPU: it decides with the library's default profile
($CHORD_PROFILE, else h200), not a hard-coded one, and --profile picks another."""
import shutil

import pytest
from conftest import load_tool

from chord._resources import profiles_dir


@pytest.fixture(scope="module")
def host_time():
    return load_tool("host_time")


def test_the_default_profile_is_the_librarys(host_time, monkeypatch, tmp_path):
    monkeypatch.delenv("CHORD_PROFILE", raising=False)
    a = host_time.parse_args([])
    assert a.profile == "h200" and not a.cprofile
    shutil.copy(profiles_dir() / "h200.json", tmp_path / "mygpu.json")
    monkeypatch.setenv("CHORD_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("CHORD_PROFILE", "mygpu")
    assert host_time.parse_args([]).profile == "mygpu"
    a = host_time.parse_args(["--profile", "h200", "--cprofile"])
    assert a.profile == "h200" and a.cprofile


def test_a_bad_profile_is_a_usage_error(host_time, capsys):
    with pytest.raises(SystemExit) as info:
        host_time.parse_args(["--profile", "no-such-gpu"])
    assert info.value.code == 2 and "--profile: profile 'no-such-gpu' not found" in capsys.readouterr().err
