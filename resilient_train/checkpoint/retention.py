"""Retention: which checkpoints to delete, and leftovers of crashed saves.

``retain`` deletes only checkpoints older than the newest good one; ``collect_garbage``
only uncommitted leftovers older than the newest good commit (never an in-flight newer
upload). The deletion itself (manifest first, so a half-finished deletion reads as
uncommitted; fenced like every write) is the commit path's ``delete``
(checkpoint/commit_path.py): this module only chooses, from a listing.
"""

from __future__ import annotations

from typing import Callable

from resilient_train.checkpoint.read_path import CheckpointInfo, Status

__all__ = ["Retention"]


class Retention:
    """What to delete among the checkpoints ``list_checkpoints`` returns, deleted by ``delete``."""

    def __init__(
        self,
        list_checkpoints: Callable[[], list[CheckpointInfo]],
        delete: Callable[[int], None],
        emit: Callable[..., None],
    ) -> None:
        self._list = list_checkpoints
        self._delete = delete
        self._emit = emit

    def retain(self, keep: int) -> list[str]:
        """Delete all but the newest ``keep`` good checkpoints; returns the deleted paths.

        Only OK (by listing) checkpoints older than the newest OK one are candidates;
        torn/corrupt ones are left for ``verify`` to report, uncommitted ones for
        ``collect_garbage``.
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"Received keep={keep!r}; expected an int >= 1")
        good = [info for info in self._list() if info.status is Status.OK]
        doomed = good[:-keep]
        for info in doomed:
            self._delete(info.global_step)
        return [info.path for info in doomed]

    def collect_garbage(self) -> list[str]:
        """Delete uncommitted directories older than the newest good commit.

        Torn or corrupt committed checkpoints are not touched (``verify`` reports them).
        Newer uncommitted directories may be uploads in progress and are left alone.
        """
        infos = self._list()
        good = [info.global_step for info in infos if info.status is Status.OK]
        if not good:
            return []
        doomed = [i for i in infos if i.status is Status.UNCOMMITTED and i.global_step < max(good)]
        for info in doomed:
            self._delete(info.global_step)
        paths = [info.path for info in doomed]
        if paths:
            self._emit("garbage_collected", group=True, paths=paths, count=len(paths))
        return paths

