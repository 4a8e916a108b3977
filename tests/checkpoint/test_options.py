"""parse_storage_options: ``--storage-option KEY=VALUE`` -> fsspec storage_options."""

from __future__ import annotations

import pytest

from resilient_train.checkpoint import parse_storage_options
from resilient_train.errors import ConfigError


def test_values_are_coerced_and_dotted_keys_nest() -> None:
    assert parse_storage_options([
        "anon=false", "use_ssl=TRUE", "default_block_size=8388608",
        "client_kwargs.endpoint_url=http://127.0.0.1:8333", "client_kwargs.region_name=us-east-1",
        "secret=a=b=c", "key=0012", "retries=-3", "token=", "latency_s=0.2", "version=1.2.3",
    ]) == {
        "anon": False, "use_ssl": True, "default_block_size": 8388608,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:8333", "region_name": "us-east-1"},
        "secret": "a=b=c", "key": "0012", "retries": -3, "token": "", "latency_s": 0.2, "version": "1.2.3",
    }
    assert parse_storage_options([]) == {}


@pytest.mark.parametrize("items, bad", [
    (["no-equals-sign"], "no-equals-sign"),
    (["=value"], "=value"),
    (["a..b=1"], "a..b=1"),
    (["client_kwargs=1", "client_kwargs.endpoint_url=x"], "client_kwargs.endpoint_url=x"),
    (["client_kwargs.endpoint_url=x", "client_kwargs=1"], "client_kwargs=1"),
])
def test_bad_items_name_the_item_and_the_expected_form(items: list[str], bad: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_storage_options(items)
    assert repr(bad) in str(raised.value)
