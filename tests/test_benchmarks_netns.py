"""benchmarks/_netns.py's plan: the names, addresses and ip/tc commands of the capped set-up
(pure; the benchmark runs them as root: benchmarks/sharded_save_capped.py)."""

from __future__ import annotations

import pytest

from benchmarks._netns import NetnsPlan
from resilient_train.cluster.worker_netns import parse_worker_netns


def _plan(**changes):
    fields = {"tag": "rtc7", "subnet": "10.213.0.0/24", "workers": 2, "rate_mbit": 100.0, "store_port": 8333}
    return NetnsPlan(**{**fields, **changes})


def test_names_and_addresses_follow_the_tag_and_the_subnet():
    plan = _plan()
    assert (plan.host, plan.bridge, plan.netns(1), plan.address(0), plan.address(1)) == \
        ("10.213.0.1", "rtc7br", "rtc7-w1", "10.213.0.2", "10.213.0.3")
    assert plan.veth(1) == ("rtc7h1", "rtc7n1")
    assert all(len(name) <= 15 for name in (plan.bridge, *plan.veth(63)))  # the kernel's IFNAMSIZ - 1
    slots = parse_worker_netns(plan.launcher_env())  # what the local launcher reads
    assert [(s.netns, s.host) for s in slots] == [("rtc7-w0", "10.213.0.2"), ("rtc7-w1", "10.213.0.3")]


def test_the_store_traffic_is_capped_both_ways_and_nothing_else_by_default():
    commands = _plan().setup()
    qdiscs = [c for c in commands if "qdisc" in c]
    assert len(qdiscs) == 4 and all(c[c.index("default") + 1] == "0" for c in qdiscs)  # the rest: unshaped
    classes = [c for c in commands if "class" in c]
    assert len(classes) == 4 and all(c[c.index("rate") + 1] == "100mbit" and c[c.index("classid") + 1] == "1:10"
                                     for c in classes)
    filters = [" ".join(c) for c in commands if "filter" in c]
    assert filters == [  # rank 0's ingress (the bridge's end), its egress (inside), then rank 1's
        "tc filter add dev rtc7h0 parent 1: protocol ip prio 1 u32 match ip src 10.213.0.1/32 match ip sport 8333 "
        "0xffff flowid 1:10",
        "tc -n rtc7-w0 filter add dev rtc7n0 parent 1: protocol ip prio 1 u32 match ip dst 10.213.0.1/32 "
        "match ip dport 8333 0xffff flowid 1:10",
        "tc filter add dev rtc7h1 parent 1: protocol ip prio 1 u32 match ip src 10.213.0.1/32 match ip sport 8333 "
        "0xffff flowid 1:10",
        "tc -n rtc7-w1 filter add dev rtc7n1 parent 1: protocol ip prio 1 u32 match ip dst 10.213.0.1/32 "
        "match ip dport 8333 0xffff flowid 1:10",
    ]
    # every device shaped exists by then: the veth is made and moved before its qdiscs
    made = [i for i, c in enumerate(commands) if c[:3] == ["ip", "link", "add"] and "veth" in c]
    shaped = [i for i, c in enumerate(commands) if "qdisc" in c]
    assert made[0] < shaped[0] and made[1] < shaped[2]


def test_a_peer_rate_shapes_the_rest_in_its_own_class():
    commands = _plan(peer_mbit=1000.0).setup()
    assert {c[c.index("default") + 1] for c in commands if "qdisc" in c} == {"20"}
    assert sum(1 for c in commands if "1:20" in c and c[c.index("rate") + 1] == "1000mbit") == 4


def test_teardown_removes_every_namespace_and_veth_and_the_bridge_last():
    plan = _plan(workers=3)
    assert plan.teardown() == [["ip", "netns", "delete", "rtc7-w0"], ["ip", "netns", "delete", "rtc7-w1"],
                               ["ip", "netns", "delete", "rtc7-w2"], ["ip", "link", "delete", "rtc7h0"],
                               ["ip", "link", "delete", "rtc7h1"], ["ip", "link", "delete", "rtc7h2"],
                               ["ip", "link", "delete", "rtc7br"]]
    made = {c[3] for c in plan.setup() if c[:3] == ["ip", "netns", "add"]}
    assert made == {c[3] for c in plan.teardown() if c[:3] == ["ip", "netns", "delete"]}


@pytest.mark.parametrize("changes, named", [
    ({"tag": "Rt"}, "tag='Rt'"),
    ({"tag": "rtcap123456"}, "tag='rtcap123456'"),
    ({"subnet": "10.213.0.0/30", "workers": 2}, "subnet='10.213.0.0/30'"),
    ({"subnet": "fd00::/64"}, "subnet='fd00::/64'"),
    ({"subnet": "10.213.0.1/24"}, "10.213.0.1/24"),
    ({"workers": 0}, "workers=0"),
    ({"rate_mbit": 0.0}, "rate_mbit=0.0"),
    ({"peer_mbit": -1.0}, "peer_mbit=-1.0"),
    ({"store_port": 70000}, "store_port=70000"),
])
def test_a_bad_plan_is_refused_naming_the_value(changes, named):
    with pytest.raises(ValueError) as raised:
        _plan(**changes)
    assert named in str(raised.value)
