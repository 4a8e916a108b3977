"""Redaction: exact outputs for secret keys, URL user info and registered values."""

import io
import json

import pytest

from resilient_train.rundir import events, redact
from resilient_train.rundir.errorfile import record_exception
from resilient_train.rundir.redact import (
    REDACTED,
    RedactingWriter,
    drop_redacted,
    is_secret_key,
    merge_secrets,
    redact_text,
    register_secrets,
    secret_keys,
    split_secrets,
)


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    monkeypatch.setattr(redact, "_registered", set())


@pytest.mark.parametrize("name", [
    "key", "secret", "token", "password", "passwd", "session_token", "client_secret", "aws_secret_access_key",
    "aws_access_key_id", "account_key", "sas_token", "SSEKMSKeyId", "credentials", "connection_string", "api-key",
])
def test_secret_keys(name):
    assert is_secret_key(name)


@pytest.mark.parametrize("name", ["anon", "endpoint_url", "region_name", "use_ssl", "client_kwargs", "keep",
                                  "monkey", "tokenizer", "requester_pays"])
def test_keys_that_are_not_secret(name):
    assert not is_secret_key(name)


def test_url_user_info_is_replaced_and_the_host_kept():
    assert redact_text("https://user:pa55@host:9000/b/p?x=1 and s3://AKIA@bucket/x") == (
        "https://***@host:9000/b/p?x=1 and s3://***@bucket/x"
    )
    assert redact_text("https://host/p@q") == "https://host/p@q"  # an @ in the path is not user info


def test_registered_values_are_replaced_anywhere_longest_first():
    register_secrets(["abcd", "abcdef", "on", 7])  # "on" is too short to register; 7 is not text
    assert redact_text("x=abcdef y=abcd on") == "x=*** y=*** on"


def test_split_merge_round_trip_keeps_public_options():
    options = {"key": "AKIA1", "secret": "s3cr3t", "anon": False,
               "client_kwargs": {"endpoint_url": "http://u:p@127.0.0.1:8333", "region_name": "x"}}
    public, secret = split_secrets(options)
    assert public == {"key": REDACTED, "secret": REDACTED, "anon": False,
                      "client_kwargs": {"endpoint_url": "http://***@127.0.0.1:8333", "region_name": "x"}}
    assert secret == {"key": "AKIA1", "secret": "s3cr3t", "client_kwargs": {"endpoint_url": "http://u:p@127.0.0.1:8333"}}
    assert merge_secrets(public, secret) == options
    assert secret_keys(options) == ["key", "secret"]


def test_a_placeholder_without_its_secret_is_dropped():
    assert drop_redacted({"key": REDACTED, "anon": False, "client_kwargs": {"token": REDACTED}}) == {
        "anon": False, "client_kwargs": {}}


def test_a_whole_subtree_under_a_secret_key_is_hidden():
    assert redact.redact({"token": {"client_id": "x", "refresh": "y"}, "n": 1}) == {"token": REDACTED, "n": 1}
    assert redact.redact({"key": "x"}, by_key=False) == {"key": "x"}


def test_events_reach_file_and_console_redacted(tmp_path):
    register_secrets(["hunter2-secret"])
    console = io.StringIO()
    events.configure(tmp_path / "events.jsonl", console=console, run_id="r")
    events.emit("storage_retry", error="denied for hunter2-secret", storage="s3://ak:hunter2-secret@b/p",
                options={"secret": "hunter2-secret", "anon": False})
    record = events.read_events(tmp_path / "events.jsonl")[0]
    assert {k: record[k] for k in ("error", "storage", "options")} == {
        "error": "denied for ***", "storage": "s3://***@b/p", "options": {"secret": REDACTED, "anon": False}}
    assert "hunter2" not in console.getvalue() and "hunter2" not in (tmp_path / "events.jsonl").read_text()


def test_error_files_are_redacted(tmp_path):
    register_secrets(["hunter2-secret"])
    try:
        raise PermissionError("bad credentials {'secret': 'hunter2-secret'} for https://me:pw@h/x")
    except PermissionError as exc:
        path = record_exception(tmp_path, 0, exc, global_step=3)
    record = json.loads(path.read_text())
    assert record["message"] == "bad credentials {'secret': '***'} for https://***@h/x"
    assert "hunter2" not in path.read_text() and "me:pw" not in path.read_text()


def test_redacting_writer_forwards_the_stream():
    stream = io.StringIO()
    register_secrets(["hunter2-secret"])
    writer = RedactingWriter(stream)
    writer.write("root cause: hunter2-secret\n")
    writer.flush()
    assert writer.getvalue() == "root cause: ***\n"
