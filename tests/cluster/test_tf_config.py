import json

import pytest

from resilient_train.cluster.ports import free_ports
from resilient_train.cluster.tf_config import ClusterInfo, build_tf_config, parse_tf_config
from resilient_train.errors import ConfigError


def test_build_and_parse_round_trip_worker_zero_is_chief():
    addresses = ["127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003"]
    infos = [parse_tf_config(json.dumps(build_tf_config(addresses, i))) for i in range(3)]
    assert infos == [ClusterInfo(3, i, "worker", i, tuple(addresses)) for i in range(3)]
    assert [i.is_chief for i in infos] == [True, False, False]
    assert [i.role for i in infos] == ["chief", "worker", "worker"]


def test_chief_task_ranks_first():
    config = {"cluster": {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"]}, "task": {"type": "worker", "index": 1}}
    assert parse_tf_config(json.dumps(config)) == ClusterInfo(3, 2, "worker", 1, ("h0:1", "h1:1", "h2:1"))
    config["task"] = {"type": "chief", "index": 0}
    info = parse_tf_config(json.dumps(config))
    assert (info.rank, info.is_chief) == (0, True)


def test_absent_tf_config_is_single_worker():
    assert parse_tf_config(None) == ClusterInfo(1, 0, "worker", 0)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("{not json", "TF_CONFIG is not valid JSON"),
        ('{"task": {"type": "worker", "index": 0}}', 'no "cluster" object'),
        ('{"cluster": {"worker": ["a:1"]}}', 'no valid "task"'),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}', "task index 3 is out of range"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}', "task type 'ps' is not supported"),
        ('{"cluster": {"worker": ["nohostport"]}, "task": {"type": "worker", "index": 0}}', 'expected a list of "host:port"'),
        ('{"cluster": {"chief": ["a:1"]}, "task": {"type": "worker", "index": 0}}', "does not appear in the cluster"),
    ],
)
def test_malformed_tf_config_names_the_problem(text, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        parse_tf_config(text)
    assert fragment in str(info.value)


def test_free_ports_are_distinct():
    ports = free_ports(4)
    assert len(set(ports)) == 4 and all(p > 0 for p in ports)


def test_build_rejects_bad_index():
    with pytest.raises(ConfigError, match=r"index=2; expected 0..1"):
        build_tf_config(["a:1", "b:2"], 2)
