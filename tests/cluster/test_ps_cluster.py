"""The parameter-server cluster layout: ranks, roles and TF_CONFIG (cluster/ps_cluster.py)."""

import json

import pytest

from resilient_train.cluster.ps_cluster import PsTask, parse_ps_tf_config, ps_task, ps_tf_config
from resilient_train.errors import ConfigError

ADDRESSES = ["127.0.0.1:1000", "127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003", "127.0.0.1:1004"]


@pytest.mark.parametrize("rank, expected", [
    (0, PsTask("chief", 0, 0)), (1, PsTask("ps", 0, 1)), (2, PsTask("ps", 1, 2)),
    (3, PsTask("worker", 0, 3)), (4, PsTask("worker", 1, 4)),
])
def test_ranks_are_coordinator_then_ps_then_workers(rank, expected):
    assert ps_task(rank, ps=2, workers=2) == expected


def test_every_rank_sees_one_cluster_and_its_own_task():
    configs = [ps_tf_config(ADDRESSES, rank, ps=2) for rank in range(5)]
    assert {json.dumps(c["cluster"], sort_keys=True) for c in configs} == {json.dumps(
        {"chief": ADDRESSES[:1], "ps": ADDRESSES[1:3], "worker": ADDRESSES[3:]}, sort_keys=True)}
    assert [c["task"] for c in configs] == [
        {"type": "chief", "index": 0}, {"type": "ps", "index": 0}, {"type": "ps", "index": 1},
        {"type": "worker", "index": 0}, {"type": "worker", "index": 1}]


def test_parse_round_trips_the_rank():
    for rank in range(5):
        task, cluster = parse_ps_tf_config(json.dumps(ps_tf_config(ADDRESSES, rank, ps=2)))
        assert task == ps_task(rank, ps=2, workers=2)
        assert cluster["worker"] == ADDRESSES[3:]


def test_a_cluster_without_a_worker_is_refused():
    with pytest.raises(ConfigError, match="Received 2 addresses with ps=1; expected at least 3"):
        ps_tf_config(ADDRESSES[:2], 0, ps=1)


def test_a_worker_only_tf_config_is_named():
    with pytest.raises(ConfigError, match="is not a parameter-server cluster"):
        parse_ps_tf_config(json.dumps({"cluster": {"worker": ADDRESSES}, "task": {"type": "worker", "index": 0}}))
