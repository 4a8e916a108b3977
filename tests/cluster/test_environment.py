"""The RT_* worker environment: the run-dir umask and storage credentials travel exactly."""

import pytest

from resilient_train.cluster.environment import UMASK, WorkerEnvironment
from resilient_train.errors import ConfigError


def test_the_run_dir_umask_travels_in_the_worker_environment():
    env = WorkerEnvironment(1, "r", umask=0o027).to_environ()
    assert env[UMASK] == "027"
    assert WorkerEnvironment.from_environ(env).umask == 0o027
    assert WorkerEnvironment.from_environ({}).umask is None


@pytest.mark.parametrize("text", ["9", "1000", "rw"])
def test_a_bad_umask_is_named(text):
    with pytest.raises(ConfigError) as caught:
        WorkerEnvironment.from_environ({UMASK: text})
    assert str(caught.value) == f"Received RT_UMASK={text!r}; expected an octal umask from 000 to 777"
