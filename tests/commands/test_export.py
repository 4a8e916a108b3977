"""``resilient-train export``: the parser offers exactly the formats the writer knows."""

from __future__ import annotations


def test_export_formats_match_the_writer() -> None:
    from resilient_train.commands.export import _FORMATS
    from resilient_train.runner.export import FORMATS

    assert _FORMATS == FORMATS
