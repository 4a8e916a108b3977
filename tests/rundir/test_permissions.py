"""Run-dir modes: the umask arithmetic and the accepted spellings, exactly."""

import os

import pytest

from resilient_train.rundir.permissions import parse_mode, run_dir_umask, umask_for


@pytest.mark.parametrize("text, mode", [("0700", 0o700), ("750", 0o750), ("0o770", 0o770), (0o755, 0o755)])
def test_accepted_modes(text, mode):
    assert parse_mode(text) == mode


@pytest.mark.parametrize("value, shown", [("0649", "'0649'"), ("rwx", "'rwx'"), ("0600", "'0600'"),
                                          (0o1777, "01777"), (True, "True")])
def test_refused_modes_name_the_value(value, shown):
    with pytest.raises(ValueError) as caught:
        parse_mode(value)
    assert str(caught.value) == (
        f"Received run_dir_mode={shown}; expected an octal mode from 0700 to 0777 that gives the owner rwx, "
        "e.g. 0700 or 0750"
    )


def test_a_stricter_user_umask_is_kept():
    assert umask_for(0o700, 0o022) == 0o077
    assert umask_for(0o750, 0o022) == 0o027
    assert umask_for(0o750, 0o077) == 0o077  # the user's own umask is stricter: kept
    assert umask_for(0o777, 0o002) == 0o002


def test_the_umask_is_restored_after_the_block(tmp_path):
    before = os.umask(0o022)
    try:
        with run_dir_umask(0o700) as inside:
            (tmp_path / "d").mkdir()
            (tmp_path / "d" / "f").write_text("x")
            assert inside == 0o077
        assert os.umask(0o022) == 0o022
        assert (tmp_path / "d").stat().st_mode & 0o777 == 0o700
        assert (tmp_path / "d" / "f").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(before)


def test_current_umask_reads_without_changing_it():
    from resilient_train.rundir.permissions import current_umask, directory_mode

    before = os.umask(0o027)
    try:
        assert current_umask() == 0o027 and current_umask() == 0o027
        assert directory_mode() == 0o750
    finally:
        os.umask(before)
