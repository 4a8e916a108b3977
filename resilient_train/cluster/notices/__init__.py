"""Cloud preemption notices: one watcher per provider behind one interface (notice_watch.py).

No events, no run dir here (this layer is below rundir's peers): the watch reports through
the callbacks it is given. The package itself holds only the settings (the option table in
job/config.py reads them on every start-up, so they import nothing); :func:`notice_sources`
builds every provider's source from an environment (their endpoint overrides), importing
the HTTP machinery only when a watch starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from resilient_train.cluster.notices.notice_watch import NoticeSource

__all__ = ["AUTO", "OFF", "PROVIDERS", "SETTINGS", "notice_sources"]

AUTO = "auto"
OFF = "off"
PROVIDERS = ("gce", "aws", "azure")  # auto's preference when two answer
SETTINGS = (AUTO, *PROVIDERS, OFF)  # --preemption-notice


def notice_sources(environ: Mapping[str, str]) -> dict[str, "NoticeSource"]:
    """Every provider's source, its endpoint from ``environ``, in :data:`PROVIDERS` order.
    ValueError naming a malformed endpoint override."""
    from resilient_train.cluster.notices.aws_notices import AwsSource
    from resilient_train.cluster.notices.azure_notices import AzureSource
    from resilient_train.cluster.notices.gce_notices import GceSource

    return {"gce": GceSource(environ), "aws": AwsSource(environ), "azure": AzureSource(environ)}
