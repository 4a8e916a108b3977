"""resilient_train/cluster/slurm_env.py: hostlist expansion and TF_CONFIG by SlurmClusterResolver's rules."""

import json

import pytest

from resilient_train.errors import ConfigError
from resilient_train.cluster.slurm_env import (
    compress_hostlist,
    environ_with_tf_config,
    expand_hostlist,
    expand_tasks_per_node,
    tf_config_from_slurm,
)


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("vm", ["vm"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[08-10],login", ["n08", "n09", "n10", "login"]),
        ("gpu-[1,4-5]x,cpu7", ["gpu-1x", "gpu-4x", "gpu-5x", "cpu7"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a[9-11]", ["a9", "a10", "a11"]),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    ("hosts", "text"),
    [(["node0"], "node0"), (["node0", "node1"], "node[0-1]"), (["n08", "n09", "n10", "login"], "login,n[08-10]")],
)
def test_compress_hostlist_is_expand_hostlists_inverse(hosts, text):
    assert compress_hostlist(hosts) == text
    assert sorted(expand_hostlist(text)) == sorted(hosts)


@pytest.mark.parametrize("text", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", ""])
def test_expand_hostlist_rejects_malformed(text):
    with pytest.raises(ConfigError, match="Slurm node list"):
        expand_hostlist(text)


def test_expand_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(ConfigError, match=r"Received Slurm tasks per node '2\(3\)'"):
        expand_tasks_per_node("2(3)")


def _task(procid, node, local, nodelist="n[1-2]", per_node="2(x2)"):
    return {
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": per_node,
        "SLURMD_NODENAME": node,
        "SLURM_LOCALID": str(local),
    }


def test_tf_config_block_order_ports_per_node():
    config = tf_config_from_slurm(_task(3, "n2", 1), port_base=9000)
    assert config == {
        "cluster": {"worker": ["n1:9000", "n1:9001", "n2:9000", "n2:9001"]},
        "task": {"type": "worker", "index": 3},
    }


def test_tf_config_falls_back_to_job_variables():
    environ = {"SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "a,b", "SLURM_TASKS_PER_NODE": "1(x2)"}
    assert tf_config_from_slurm(environ)["cluster"] == {"worker": ["a:8888", "b:8888"]}


def test_tf_config_refuses_non_block_distribution():
    # cyclic: rank 1 runs on the second node as its local task 0
    with pytest.raises(ConfigError, match="--distribution=block"):
        tf_config_from_slurm(_task(1, "n2", 0))


def test_tf_config_outside_slurm_names_the_variables():
    with pytest.raises(ConfigError, match="SLURM_PROCID not set; --tf-config-from slurm works only inside a Slurm task"):
        tf_config_from_slurm({})


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({**_task(0, "n1", 0), "SLURM_PROCID": "x"}, "Received SLURM_PROCID='x'"),
        (_task(4, "n1", 0), "SLURM_PROCID=4 is outside the step's 4 task"),
        (_task(0, "n1", 0, per_node="2"), "one count per node"),
    ],
)
def test_tf_config_rejects_inconsistent_environment(environ, message):
    with pytest.raises(ConfigError, match=message):
        tf_config_from_slurm(environ)


def test_port_base_range():
    with pytest.raises(ConfigError, match="Received port_base=70000"):
        tf_config_from_slurm(_task(0, "n1", 0), port_base=70000)
    with pytest.raises(ConfigError, match="ports past 65535"):
        tf_config_from_slurm(_task(0, "n1", 0), port_base=65535)


def test_environ_with_tf_config():
    environ = _task(0, "n1", 0)
    assert environ_with_tf_config(environ, "env", 1) is environ
    built = environ_with_tf_config(environ, "slurm", 7000)
    assert json.loads(built["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}


def test_worker_reports_slurm_config_error_in_one_line(capsys):
    from resilient_train.runner.process.worker_main import main

    code = main(["recipes/linear_regression.py", "--tf-config-from", "slurm"], environ={})
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["resilient-train worker: SLURM_PROCID not set; --tf-config-from slurm works only inside a Slurm task (srun)"]
