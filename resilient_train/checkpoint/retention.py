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

_Listing = tuple[tuple[str, int], ...]

__all__ = ["Retention"]


class Retention:
    """What to delete among the checkpoints ``scan`` lists (``inspect`` tells each one's
    status), deleted by ``delete``."""

    def __init__(
        self,
        scan: Callable[[], dict[int, dict[str, int]]],
        inspect: Callable[[int, dict[str, int]], CheckpointInfo],
        delete: Callable[[int], None],
        emit: Callable[..., None],
    ) -> None:
        self._delete = delete
        self._emit = emit
        self._scan = scan
        self._inspect = inspect
        # retain(): each directory's listing and status when retention last inspected it
        self._seen: dict[int, tuple[_Listing, CheckpointInfo]] = {}

    def retain(self, keep: int) -> list[str]:
        """Delete all but the newest ``keep`` good checkpoints; returns the deleted paths.

        Only OK (by listing) checkpoints older than the newest OK one are candidates;
        torn/corrupt ones are left for ``verify`` to report, uncommitted ones for
        ``collect_garbage``.
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"Received keep={keep!r}; expected an int >= 1")
        steps = self._scan()
        good = [info for info in (self._inspect_unless_seen(step, steps[step]) for step in sorted(steps))
                if info.status is Status.OK]
        self._seen = {step: seen for step, seen in self._seen.items() if step in steps}
        doomed = good[:-keep]
        for info in doomed:
            self._delete(info.global_step)
        return [info.path for info in doomed]

    def _inspect_unless_seen(self, step: int, files: dict[str, int]) -> CheckpointInfo:
        """``inspect``, without re-reading a manifest whose directory lists exactly as before.

        Retention runs after every commit; reading every kept manifest each time was most
        of a small commit's storage calls. A committed directory whose names and sizes are
        unchanged has the same status (the status is the listing against the manifest's
        names and sizes), which is all retention decides on.
        """
        listing = tuple(sorted(files.items()))
        seen = self._seen.get(step)
        if seen is not None and seen[0] == listing:
            return seen[1]
        info = self._inspect(step, files)
        self._seen[step] = (listing, info)
        return info

    def collect_garbage(self) -> list[str]:
        """Delete uncommitted directories older than the newest good commit.

        Torn or corrupt committed checkpoints are not touched (``verify`` reports them).
        Newer uncommitted directories may be uploads in progress and are left alone.
        """
        steps = self._scan()
        infos = [self._inspect(step, steps[step]) for step in sorted(steps)]
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

