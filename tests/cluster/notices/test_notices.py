"""The preemption-notice watchers against a real loopback server that speaks each provider's
protocol (tests/support/metadata_server.py): the exact requests, the exact notices, and a
garbled or silent server that changes nothing."""

from __future__ import annotations

import threading

import pytest

from resilient_train.cluster.notices import notice_sources
from resilient_train.cluster.notices.notice_watch import Feed, Notice, NoticeSource, NoticeWatch
from resilient_train.cluster.notices.aws_notices import AwsSource
from resilient_train.cluster.notices.azure_notices import AzureSource
from resilient_train.cluster.notices.gce_notices import GceSource
from resilient_train.cluster.notices.metadata_http import MetadataError, split_endpoint
from tests.support.metadata_server import (
    AWS_ACTION, AWS_REBALANCE, MetadataServer, Request, VM_NAME, _etag,
)

GOOGLE = {"metadata-flavor": "Google"}
AZURE = {"metadata": "true"}
WAIT = 30.0  # an upper bound for a background thread to get somewhere, never a measured time


# ------------------------------------------------------------ GCE
def test_gce_probes_with_the_flavor_header_and_long_polls_preempted_by_etag():
    with MetadataServer("gce") as server:
        source = GceSource(server.environ(), wait_s=60)
        assert source.probe(2.0) is True
        preempted, maintenance = source.feeds()
        assert (preempted.name, preempted.every_s, maintenance.name) == ("preempted", 0, "maintenance-event")
        assert preempted.poll() == []  # FALSE: read once, with its ETag
        server.set_gce("instance/preempted", "TRUE")
        assert preempted.poll() == [Notice("gce", "preempted", stops=True)]
        assert server.requests == [
            Request("GET", "/computeMetadata/v1/", GOOGLE),
            Request("GET", "/computeMetadata/v1/instance/preempted", GOOGLE),
            Request("GET", "/computeMetadata/v1/instance/preempted?wait_for_change=true"
                    f"&last_etag={_etag('FALSE')}&timeout_sec=60", GOOGLE),
        ]


def test_gce_wait_for_change_returns_when_the_value_changes():
    with MetadataServer("gce") as server:
        feed = GceSource(server.environ(), wait_s=60).feeds()[0]
        assert feed.poll() == []
        threading.Timer(0.3, server.set_gce, ("instance/preempted", "TRUE")).start()
        assert feed.poll() == [Notice("gce", "preempted", stops=True)]  # held by the server until the change


@pytest.mark.parametrize("value, notice", [
    ("NONE", None),
    ("MIGRATE_ON_HOST_MAINTENANCE", Notice("gce", "MIGRATE_ON_HOST_MAINTENANCE", stops=False)),
    ("TERMINATE_ON_HOST_MAINTENANCE", Notice("gce", "TERMINATE_ON_HOST_MAINTENANCE", stops=True)),
])
def test_gce_maintenance_event_values(value, notice):
    with MetadataServer("gce") as server:
        server.set_gce("instance/maintenance-event", value)
        feed = GceSource(server.environ()).feeds()[1]
        assert feed.poll() == ([notice] if notice else [])


def test_gce_probe_refuses_a_server_without_the_flavor_answer():
    with MetadataServer("aws") as server:  # answers, but not as GCE
        assert GceSource({"GCE_METADATA_HOST": server.address}).probe(2.0) is False


# ------------------------------------------------------------ AWS
def test_aws_imdsv2_token_then_spot_instance_action():
    with MetadataServer("aws") as server:
        source = AwsSource(server.environ())
        assert source.probe(2.0) is True
        assert source.poll() == []  # 404, 404: nothing announced
        server.announce()
        assert source.poll() == [Notice("aws", "spot_terminate", stops=True, deadline="2026-11-26T12:02:00Z")]
        token = {"x-aws-ec2-metadata-token": "token-1"}
        assert server.requests == [
            Request("PUT", "/latest/api/token", {"x-aws-ec2-metadata-token-ttl-seconds": "21600"}),
            Request("GET", AWS_ACTION, token), Request("GET", AWS_REBALANCE, token),
            Request("GET", AWS_ACTION, token), Request("GET", AWS_REBALANCE, token),
        ]
        assert source.feeds()[0].every_s == 5.0  # AWS's advice


def test_aws_a_rejected_token_is_renewed_once_and_rebalance_is_recorded_only():
    with MetadataServer("aws") as server:
        source = AwsSource(server.environ())
        assert source.probe(2.0) is True
        server.forget_tokens()
        server.set_aws(AWS_REBALANCE, {"noticeTime": "2026-11-26T11:50:00Z"})
        assert source.poll() == [Notice("aws", "rebalance_recommendation", stops=False)]
        assert [(r.method, r.path, r.headers.get("x-aws-ec2-metadata-token")) for r in server.requests[1:]] == [
            ("GET", AWS_ACTION, "token-1"), ("PUT", "/latest/api/token", None),
            ("GET", AWS_ACTION, "token-2"), ("GET", AWS_REBALANCE, "token-2"),
        ]


# ------------------------------------------------------------ Azure
def test_azure_scheduled_events_preempt_and_the_acknowledgement():
    with MetadataServer("azure") as server:
        source = AzureSource(server.environ())
        assert source.probe(2.0) is True and source.vm_name == VM_NAME
        assert source.poll() == []
        server.announce()
        notice = Notice("azure", "Preempt", stops=True, deadline="2026-11-26T12:00:30Z",
                        ref="602d9444-d2cd-49c7-8624-8643e7171297")
        assert source.poll() == [notice]
        assert source.poll() == []  # the same DocumentIncarnation: not read again
        source.acknowledge([notice])
        assert server.acknowledged == [{"StartRequests": [{"EventId": "602d9444-d2cd-49c7-8624-8643e7171297"}]}]
        events = "/metadata/scheduledevents?api-version=2020-07-01"
        assert server.requests == [
            Request("GET", "/metadata/instance/compute/name?api-version=2021-02-01&format=text", AZURE),
            Request("GET", events, AZURE), Request("GET", events, AZURE), Request("GET", events, AZURE),
            Request("POST", events, {**AZURE, "content-type": "application/json"},
                    '{"StartRequests": [{"EventId": "602d9444-d2cd-49c7-8624-8643e7171297"}]}'),
        ]


def test_azure_ignores_another_vms_event_and_records_a_freeze():
    with MetadataServer("azure") as server:
        source = AzureSource(server.environ())
        assert source.probe(2.0) is True
        server.set_azure([
            {"EventId": "a", "EventType": "Preempt", "Resources": ["other-vm"], "NotBefore": ""},
            {"EventId": "b", "EventType": "Freeze", "Resources": [VM_NAME], "NotBefore": ""},
        ])
        assert source.poll() == [Notice("azure", "Freeze", stops=False, ref="b")]


# ------------------------------------------------------------ a server that misbehaves
@pytest.mark.parametrize("provider", ["gce", "aws", "azure"])
def test_a_garbled_server_raises_metadata_error_from_the_feed(provider):
    with MetadataServer(provider) as server:
        source = notice_sources(server.environ())[provider]
        server.garble = True
        with pytest.raises(MetadataError):
            source.feeds()[0].poll()


class _Recorder:
    def __init__(self) -> None:
        self.notices: list[Notice] = []
        self.events: list[tuple[str, dict]] = []
        self.changed = threading.Event()

    def notice(self, notice: Notice) -> None:
        self.notices.append(notice)
        self.changed.set()

    def event(self, name: str, **fields) -> None:
        self.events.append((name, fields))
        self.changed.set()


def _watch(setting: str, environ: dict, recorder: _Recorder, **settings) -> NoticeWatch:
    # A probe of a server that is there gets WAIT, not the 0.5 s a metadata server one hop away
    # needs: this test process's own server thread may be slow to answer on a busy machine.
    settings.setdefault("probe_timeout_s", WAIT)
    return NoticeWatch(setting, notice_sources(environ), on_notice=recorder.notice, on_event=recorder.event,
                       **settings)


def _nowhere(closed: str) -> dict[str, str]:
    return {"GCE_METADATA_HOST": closed, "AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{closed}",
            "RT_AZURE_METADATA_HOST": closed}


def test_auto_with_no_metadata_server_watches_nothing_and_says_nothing(unused_tcp_address):
    recorder = _Recorder()
    watch = _watch("auto", _nowhere(unused_tcp_address), recorder)
    watch.start()
    assert watch.resolved.wait(WAIT)
    assert (watch.source, recorder.events, recorder.notices) == (None, [], [])


@pytest.mark.parametrize("provider", ["gce", "aws", "azure"])
def test_auto_finds_the_provider_that_answers_and_hands_over_its_notice_once(provider, unused_tcp_address):
    recorder = _Recorder()
    with MetadataServer(provider) as server:
        watch = _watch("auto", {**_nowhere(unused_tcp_address), **server.environ()}, recorder)
        for source in watch.sources.values():  # no test waits AWS's 5 s or Azure's 1 s
            if hasattr(source, "every_s"):
                source.every_s = 0.05
        watch.start()
        assert watch.resolved.wait(WAIT) and watch.source.provider == provider
        server.announce()
        while not recorder.notices:
            assert recorder.changed.wait(WAIT)
            recorder.changed.clear()
        watch.close()
    assert [n.provider for n in recorder.notices] == [provider]
    assert recorder.events[0] == ("preemption_notice_watch", {
        "provider": provider, "setting": "auto", "endpoint": server.address,
        "feeds": {"gce": ["preempted", "maintenance-event"], "aws": ["spot"], "azure": ["scheduled-events"]}[provider]})


def test_a_garbled_server_is_reported_once_and_ignored():
    recorder = _Recorder()
    with MetadataServer("aws") as server:
        watch = _watch("aws", server.environ(), recorder, backoff_max_s=0.05)
        watch.sources["aws"].every_s = 0.05
        watch.start()
        assert watch.resolved.wait(WAIT) and watch.source is not None
        server.garble = True  # after the probe: each poll now reads a captive portal's page
        while not any(name == "preemption_notice_error" for name, _ in recorder.events):
            assert recorder.changed.wait(WAIT)
            recorder.changed.clear()
        polls = len(server.requests)
        while len(server.requests) < polls + 6:  # it went on polling, backing off
            threading.Event().wait(0.05)
        watch.close()
    errors = [fields for name, fields in recorder.events if name == "preemption_notice_error"]
    assert errors == [{"provider": "aws", "feed": "spot",
                       "error": f"GET {AWS_ACTION}: '<html>captive portal</html>' is not a JSON object"}]
    assert recorder.notices == []


def test_a_silent_server_is_no_provider_and_start_never_waits_for_it():
    recorder = _Recorder()
    with MetadataServer("gce") as server:
        server.hold()  # accepts, answers nothing until released
        watch = _watch("gce", server.environ(), recorder, probe_timeout_s=0.2)
        watch.start()  # returns at once: the probe is on the watch's thread
        assert watch.resolved.wait(WAIT)
        server.release()
    assert watch.source is None and recorder.notices == []
    assert recorder.events == [("preemption_notice_error", {
        "provider": "gce", "feed": "probe", "error": f"no gce metadata server answered at {server.address}"})]


def test_off_starts_nothing():
    recorder = _Recorder()
    watch = NoticeWatch("off", {}, on_notice=recorder.notice, on_event=recorder.event)
    watch.start()
    assert watch.resolved.is_set() and watch.source is None and recorder.events == []


@pytest.mark.parametrize("text, expected", [
    ("169.254.169.254", ("169.254.169.254", 80)), ("127.0.0.1:8080", ("127.0.0.1", 8080)),
    ("http://127.0.0.1:8080/", ("127.0.0.1", 8080)), ("http://[fd00:ec2::254]", ("fd00:ec2::254", 80)),
])
def test_split_endpoint(text, expected):
    assert split_endpoint(text) == expected


@pytest.mark.parametrize("text", ["https://169.254.169.254", "host:port", "", "http://a/b"])
def test_split_endpoint_refuses(text):
    with pytest.raises(ValueError, match="metadata endpoint"):
        split_endpoint(text)


@pytest.fixture
def unused_tcp_address() -> str:
    import socket

    with socket.socket() as probe:  # bound, then released: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_the_flag_is_in_the_option_table_and_checked():
    from resilient_train.errors import ConfigError
    from resilient_train.job.config import JobConfig, job_from_args
    from resilient_train.runner.process.worker_main import argument_parser

    assert JobConfig(recipe="r.py").preemption_notice == "auto"
    args = argument_parser().parse_args(["r.py", "--preemption-notice", "aws"])
    assert job_from_args(args).preemption_notice == "aws"
    with pytest.raises(ConfigError, match="preemption_notice='ibm'"):
        JobConfig(recipe="r.py", preemption_notice="ibm")


class _Once(NoticeSource):
    """A long-poll feed whose server answers at once, with nothing (wait_for_change ignored)."""

    provider = "gce"

    def __init__(self, polls_before_close: int) -> None:
        self.polls, self.limit, self.watch = 0, polls_before_close, None

    def probe(self, timeout_s):
        return True

    def feeds(self):
        return [Feed("fast", self._poll, every_s=0)]

    def _poll(self):
        self.polls += 1
        if self.polls == self.limit:
            self.watch.close()
        return []


def test_a_long_poll_that_returns_at_once_is_not_a_tight_loop():
    recorder, waits, ticks = _Recorder(), [], iter(range(1000))
    source = _Once(polls_before_close=3)
    watch = NoticeWatch("gce", {"gce": source}, on_notice=recorder.notice, on_event=recorder.event,
                        clock=lambda: next(ticks) * 0.25, wait=waits.append)
    source.watch = watch
    watch._follow(source, source.feeds()[0])  # on this thread, until the third poll closes the watch
    assert (source.polls, waits) == (3, [0.75, 0.75])  # the 1 s floor less the 0.25 s each poll took (fake clock)


class _Scripted(NoticeSource):
    """A feed whose polls return the given lists in turn; the watch is closed after the last."""

    provider = "gce"

    def __init__(self, polls) -> None:
        self.polls, self.watch = list(polls), None

    def probe(self, timeout_s):
        return True

    def feeds(self):
        return [Feed("scripted", self._poll, every_s=0.5)]

    def _poll(self):
        found = self.polls.pop(0)
        if not self.polls:
            self.watch.close()
        return found


def test_a_standing_notice_is_handed_over_once_and_a_returning_one_again():
    migrate, preempted = Notice("gce", "MIGRATE_ON_HOST_MAINTENANCE", stops=False), Notice("gce", "preempted", stops=True)
    recorder, waits = _Recorder(), []
    source = _Scripted([[migrate], [migrate], [], [migrate], [migrate, preempted]])
    watch = NoticeWatch("gce", {"gce": source}, on_notice=recorder.notice, on_event=recorder.event, wait=waits.append)
    source.watch = watch
    watch._follow(source, source.feeds()[0])
    assert recorder.notices == [migrate, migrate, preempted]
    assert waits == [0.5, 0.5, 0.5, 0.5]  # every_s between polls, none after the close


def test_azure_reports_an_event_once_across_documents():
    with MetadataServer("azure") as server:
        source = AzureSource(server.environ())
        assert source.probe(2.0) is True
        server.announce()
        assert [n.kind for n in source.poll()] == ["Preempt"]
        server.set_azure([{**server.azure_events[0], "EventStatus": "Started"}])  # a new incarnation, the same event
        assert source.poll() == []
