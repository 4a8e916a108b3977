"""RT_LOCAL_WORKER_NETNS: each local rank in its own network namespace (cluster/worker_netns.py),
and the local launcher that starts ranks there (supervisor/launchers/local.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from resilient_train.cluster.worker_netns import (
    LOCAL_WORKER_NETNS,
    WorkerNetns,
    parse_worker_netns,
    worker_netns_from,
    wrap_argv,
)
from resilient_train.errors import ConfigError
from resilient_train.job.config import JobConfig
from resilient_train.supervisor.launchers import local
from resilient_train.supervisor.launchers.api import WorkerSpec

TWO = json.dumps([{"netns": "rtc1-w0", "host": "10.213.0.2"}, {"netns": "rtc1-w1", "host": "10.213.0.3"}])


def test_the_variable_names_each_ranks_namespace_and_host():
    slots = parse_worker_netns(TWO)
    assert slots == (WorkerNetns("rtc1-w0", "10.213.0.2"), WorkerNetns("rtc1-w1", "10.213.0.3"))
    assert worker_netns_from({LOCAL_WORKER_NETNS: TWO}) == slots
    assert worker_netns_from({}) == () and worker_netns_from({LOCAL_WORKER_NETNS: " "}) == ()
    assert wrap_argv(["python", "-m", "w"], slots, 1) == ["ip", "netns", "exec", "rtc1-w1", "python", "-m", "w"]
    assert wrap_argv(["python"], (), 5) == ["python"]  # no namespaces: the command itself
    assert slots[0].address(4242) == "10.213.0.2:4242"
    assert WorkerNetns("a", "fd00::7").address(4242) == "[fd00::7]:4242"


@pytest.mark.parametrize("text, named", [
    ("not json", "'not json'"),
    ("{}", "'{}'"),
    ("[]", "'[]'"),
    ('[{"netns": "w0"}]', "entry 0"),
    ('[{"netns": "w0", "host": "node-a"}]', "host='node-a'"),
    ('[{"netns": "-w0", "host": "10.0.0.2"}]', "netns='-w0'"),
    ('[{"netns": "a b", "host": "10.0.0.2"}]', "netns='a b'"),
    ('[{"netns": "w0", "host": "10.0.0.2"}, {"netns": "w0", "host": "10.0.0.3"}]', "netns 'w0'"),
    ('[{"netns": "w0", "host": "10.0.0.2"}, {"netns": "w1", "host": "10.0.0.2"}]', "host '10.0.0.2'"),
])
def test_a_bad_value_is_refused_naming_it(text, named):
    with pytest.raises(ConfigError) as raised:
        parse_worker_netns(text)
    assert LOCAL_WORKER_NETNS in str(raised.value) and named in str(raised.value)


def test_fewer_namespaces_than_ranks_is_refused():
    with pytest.raises(ConfigError, match="2 entries for rank 2"):
        wrap_argv(["python"], parse_worker_netns(TWO), 2)


class _Spawned:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def __call__(self, argv, env, log_path):
        self.calls.append((argv, env))
        return SimpleNamespace(pid=1000 + len(self.calls), poll=lambda: None, send_signal=lambda sig: None)


def _launcher(tmp_path, monkeypatch, netns_text, *, workers=2):
    monkeypatch.setenv(LOCAL_WORKER_NETNS, netns_text)
    spawner = _Spawned()
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path), workers=workers)
    return local.LocalLauncher(job, spawner=spawner), spawner, job


def test_the_local_launcher_starts_each_rank_in_its_namespace_at_its_host(tmp_path, monkeypatch):
    emitted = []
    monkeypatch.setattr(local.events, "emit", lambda name, **fields: emitted.append((name, fields)))
    launcher, spawner, job = _launcher(tmp_path, monkeypatch, TWO)
    launcher.prepare()
    assert launcher.pool is None  # standbys are forked in the supervisor's namespace
    assert emitted == [("standby_disabled", {"reason": "RT_LOCAL_WORKER_NETNS: each worker starts in its own "
                                                       "network namespace"})]
    launcher.start([WorkerSpec(rank=r, attempt=1, job=job, attempt_dir=tmp_path) for r in range(2)])
    (argv0, env0), (argv1, env1) = spawner.calls
    assert argv0[:4] == ["ip", "netns", "exec", "rtc1-w0"] and argv1[:4] == ["ip", "netns", "exec", "rtc1-w1"]
    assert argv0[4:6] == [launcher.python, "-m"]
    cluster = json.loads(env0["TF_CONFIG"])["cluster"]["worker"]
    assert [a.rsplit(":", 1)[0] for a in cluster] == ["10.213.0.2", "10.213.0.3"]
    assert json.loads(env1["TF_CONFIG"]) == {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": 1}}


def test_the_local_launcher_refuses_more_ranks_than_namespaces(tmp_path, monkeypatch):
    launcher, spawner, job = _launcher(tmp_path, monkeypatch, TWO, workers=3)
    with pytest.raises(ConfigError, match="2 entries for rank 2"):
        launcher.start([WorkerSpec(rank=r, attempt=1, job=job, attempt_dir=tmp_path) for r in range(3)])
    assert spawner.calls == []


def test_without_the_variable_every_rank_is_on_loopback(tmp_path, monkeypatch):
    monkeypatch.delenv(LOCAL_WORKER_NETNS, raising=False)
    spawner = _Spawned()
    job = JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path), warm_standby=False)
    launcher = local.LocalLauncher(job, spawner=spawner)
    launcher.start([WorkerSpec(rank=r, attempt=1, job=job, attempt_dir=tmp_path) for r in range(2)])
    assert [argv[0] for argv, _ in spawner.calls] == [launcher.python] * 2
    cluster = json.loads(spawner.calls[0][1]["TF_CONFIG"])["cluster"]["worker"]
    assert [a.rsplit(":", 1)[0] for a in cluster] == ["127.0.0.1", "127.0.0.1"]
