"""Manifest schema: round trip, validation, and refusal of malformed manifests."""

from __future__ import annotations

import dataclasses
import json

import pytest

from resilient_train.checkpoint import FileEntry, Manifest
from resilient_train.errors import CheckpointCorruptError

SHA = "0123456789abcdef" * 4


def make(**changes) -> Manifest:
    fields = dict(
        schema_version=1, run_id="run-1", epoch=2, step_in_epoch=3, global_step=23, world_size=2,
        tf_version="2.21.0", created_at="2026-01-02T03:04:05.678+00:00",
        files={"ckpt.index": FileEntry(10, SHA), "sub/ckpt.data-00000-of-00001": FileEntry(1000, SHA)},
        weights_sha256=SHA, extra={"completed": True, "epochs": 5},
    )
    fields.update(changes)
    return Manifest(**fields)


def test_round_trip_and_total_size() -> None:
    manifest = make()
    assert Manifest.from_json(manifest.to_json(), path="m") == manifest
    assert manifest.total_size == 1010
    assert manifest.to_json() == make().to_json()  # deterministic text


@pytest.mark.parametrize("changes, message", [
    ({"epoch": -1}, "epoch=-1"),
    ({"global_step": True}, "global_step=True"),
    ({"world_size": 0}, "world_size=0"),
    ({"run_id": ""}, "run_id=''"),
    ({"schema_version": 2}, "schema_version=2"),
    ({"created_at": "yesterday"}, "created_at='yesterday'"),
    ({"created_at": "2026-01-02T03:04:05+02:00"}, "expected a UTC timestamp"),
    ({"weights_sha256": "xyz"}, "weights_sha256='xyz'"),
    ({"files": {}}, "files={}"),
    ({"files": {"../escape": FileEntry(1, SHA)}}, "'../escape'"),
    ({"files": {"/abs": FileEntry(1, SHA)}}, "'/abs'"),
    ({"files": {"MANIFEST.json": FileEntry(1, SHA)}}, "reserved for the manifest"),
    ({"extra": {"bad": object()}}, "JSON-serialisable"),
])
def test_invalid_values_are_named(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        make(**changes)


@pytest.mark.parametrize("size, sha, message", [(-1, SHA, "size=-1"), (1, "ABC", "sha256='ABC'")])
def test_file_entry_is_validated(size: int, sha: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FileEntry(size, sha)


def _mutated(mutate) -> str:
    record = json.loads(make().to_json())
    mutate(record)
    return json.dumps(record)


@pytest.mark.parametrize("text, message", [
    ("{not json", "manifest is not valid JSON"),
    ("[1, 2]", "manifest is not a JSON object"),
    (_mutated(lambda r: r.update(schema_version=99)), "unsupported schema_version 99"),
    (_mutated(lambda r: r.pop("global_step")), "lacks field(s) global_step"),
    (_mutated(lambda r: r.update(surprise=1)), "unknown field(s) surprise"),
    (_mutated(lambda r: r["files"]["ckpt.index"].update(size="ten")), "size='ten'"),
    (_mutated(lambda r: r["files"].update({"x": [1]})), "files['x']"),
    (_mutated(lambda r: r.update(files=[])), "files=[]"),
])
def test_malformed_manifest_names_the_path_and_the_problem(text: str, message: str) -> None:
    with pytest.raises(CheckpointCorruptError) as raised:
        Manifest.from_json(text, path="s3://b/run/ckpt-000000000023/MANIFEST.json")
    assert str(raised.value).startswith("s3://b/run/ckpt-000000000023/MANIFEST.json: ")
    assert message in str(raised.value)


def test_extra_is_optional_in_json_and_manifest_is_frozen() -> None:
    text = _mutated(lambda r: r.pop("extra"))
    assert Manifest.from_json(text, path="m").extra == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        make().epoch = 3  # type: ignore[misc]
