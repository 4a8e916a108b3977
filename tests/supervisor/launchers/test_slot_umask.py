"""A Ray slot actor takes the run's umask (RT_UMASK) before it writes an attempt into its dir."""

import os

from resilient_train.cluster.environment import WorkerEnvironment
from resilient_train.supervisor.launchers._slot import _narrow_umask


def test_the_slot_narrows_its_umask_and_its_dirs(tmp_path):
    slot = tmp_path / "slot-0"
    slot.mkdir()
    slot.chmod(0o755)
    before = os.umask(0o022)  # a Ray actor started with the node's 022
    try:
        _narrow_umask(WorkerEnvironment(1, "r", umask=0o027).to_environ(), (tmp_path, slot))
        assert os.umask(0o022) == 0o027
        assert {p.stat().st_mode & 0o777 for p in (tmp_path, slot)} == {0o750}
    finally:
        os.umask(before)


def test_without_rt_umask_nothing_changes(tmp_path):
    tmp_path.chmod(0o755)
    before = os.umask(0o022)
    try:
        _narrow_umask({}, (tmp_path,))
        assert os.umask(before) == 0o022
        assert tmp_path.stat().st_mode & 0o777 == 0o755
    finally:
        os.umask(before)
