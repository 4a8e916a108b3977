"""Cloud preemption notices: one watcher per provider behind one interface (notice_watch.py).

No events, no run dir here (this layer is below rundir's peers): the watch reports through
the callbacks it is given. :func:`notice_sources` builds every provider's source from an
environment (their endpoint overrides).
"""

from __future__ import annotations

from typing import Mapping

from resilient_train.cluster.notices.aws_notices import AwsSource
from resilient_train.cluster.notices.azure_notices import AzureSource
from resilient_train.cluster.notices.gce_notices import GceSource
from resilient_train.cluster.notices.notice_watch import AUTO, OFF, SETTINGS, Notice, NoticeSource, NoticeWatch

__all__ = ["AUTO", "OFF", "SETTINGS", "Notice", "NoticeSource", "NoticeWatch", "notice_sources"]


def notice_sources(environ: Mapping[str, str]) -> dict[str, NoticeSource]:
    """Every provider's source, its endpoint from ``environ``; in the order ``auto`` prefers."""
    return {"gce": GceSource(environ), "aws": AwsSource(environ), "azure": AzureSource(environ)}
