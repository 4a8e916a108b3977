"""The ``verify`` and ``ls`` commands: what is in a checkpoint root, and can it be restored.

Exit codes (a contract with scripts and CI; see errors.py):

* 0 (EXIT_OK): at least one checkpoint is committed and every committed one checks out
  (uncommitted leftovers are not checkpoints and do not fail the check);
* 1 (EXIT_FAILURE): at least one committed checkpoint is torn or corrupt, or a manifest
  does not parse (``corrupt manifest``), or nothing is committed at all (``no committed
  checkpoint``): a check that found nothing to check must not pass; the output still
  names the newest restorable one, which is what a restart would use;
* 2 (EXIT_USAGE): the URL is not a checkpoint root (a local path that does not exist, a
  file, a run directory) or the storage cannot be read (bad URL, no bucket, no
  permission, retries exhausted); one or two lines on stderr, no traceback.

``ls`` is ``verify`` without hashing (sizes from the listing only), so it is fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, TextIO

from resilient_train.checkpoint.store import CheckpointInfo, CheckpointStore, Status
from resilient_train.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, StorageError

__all__ = ["add_parser", "main", "format_rows", "verify_command", "ls_command", "status_text", "newest_restorable"]

def add_parser(subparsers: Any) -> None:
    """Both subcommands: ``verify`` and ``ls`` take the same arguments."""
    for name, help_text in (("verify", "verify every checkpoint (hashes all files)"), ("ls", "list checkpoints (no hashing)")):
        parser = subparsers.add_parser(name, help=help_text)
        parser.add_argument("url", help="storage URL (the --storage of the run)")
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
        parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from resilient_train.checkpoint import parse_storage_options

    options = parse_storage_options(args.storage_option)
    if args.command == "ls":
        return ls_command(args.url, options, as_json=args.json)
    return verify_command(args.url, options, as_json=args.json, hash=True)


_HEADER = ("global_step", "epoch", "step_in_epoch", "size", "status")


def status_text(info: CheckpointInfo) -> str:
    """``ok``, ``uncommitted``, ``torn: missing file X``, ``corrupt: sha256 mismatch in X``."""
    if info.status in (Status.TORN, Status.CORRUPT) and info.detail:
        return f"{info.status.value}: {info.detail}"
    if _corrupt_manifest(info):
        return f"corrupt manifest: {info.detail[len(_UNREADABLE):]}"
    return info.status.value


_UNREADABLE = "manifest unreadable: "


def _corrupt_manifest(info: CheckpointInfo) -> bool:
    """A MANIFEST.json exists but does not parse: a damaged commit, not an unfinished upload."""
    return info.status is Status.UNCOMMITTED and info.detail.startswith(_UNREADABLE)


def _not_a_checkpoint_root(store: CheckpointStore) -> str | None:
    """Why a local ``store`` root cannot hold checkpoints, or None (remote roots: listing decides)."""
    if not store.local:
        return None
    root = Path(store.root)
    if not root.exists():
        return f"{store.url} does not exist; expected a checkpoint root (the --storage of a run)"
    if not root.is_dir():
        return f"{store.url} is a file; expected a checkpoint root directory (the --storage of a run)"
    if (root / "run.json").is_file() and not any(root.glob("ckpt-*")):
        return (f"{store.url} is a run directory, not a checkpoint root; its checkpoints are in "
                f"{root / 'checkpoints'} unless the run was given --storage")
    return None


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # unreachable: the loop returns at GiB


def format_rows(infos: Iterable[CheckpointInfo]) -> str:
    """A fixed-width table, one row per checkpoint directory, ascending global_step."""
    rows = [_HEADER]
    for info in infos:
        manifest = info.manifest
        rows.append((
            str(info.global_step),
            str(manifest.epoch) if manifest else "-",
            str(manifest.step_in_epoch) if manifest else "-",
            _human(info.size),
            status_text(info),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER) - 1)]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
    return "\n".join(lines)


def newest_restorable(infos: Iterable[CheckpointInfo]) -> CheckpointInfo | None:
    good = [info for info in infos if info.status is Status.OK]
    return good[-1] if good else None


def _as_json(url: str, infos: list[CheckpointInfo], newest: CheckpointInfo | None) -> str:
    checkpoints: list[dict[str, Any]] = [
        {
            "global_step": info.global_step,
            "epoch": info.manifest.epoch if info.manifest else None,
            "step_in_epoch": info.manifest.step_in_epoch if info.manifest else None,
            "size": info.size,
            "status": info.status.value,
            "detail": info.detail,
            "path": info.path,
        }
        for info in infos
    ]
    record = {"url": url, "checkpoints": checkpoints,
              "newest_restorable": newest.global_step if newest else None}
    return json.dumps(record, indent=2)


def verify_command(
    url: str,
    storage_options: Mapping[str, Any] | None,
    *,
    as_json: bool,
    hash: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
    store: CheckpointStore | None = None,
) -> int:
    """Print the state of every checkpoint under ``url``; return the exit code (see above).

    ``store`` may be passed instead of building one from ``url`` (tests, the faulty fs).
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        store = store or CheckpointStore(url, storage_options)
        problem = _not_a_checkpoint_root(store)
        if problem is not None:
            err.write(f"error: {problem}\n")
            return EXIT_USAGE
        infos = store.verify() if hash else store.list()
    except StorageError as exc:
        err.write(f"error: {exc}\n")
        return EXIT_USAGE
    newest = newest_restorable(infos)
    bad = [info for info in infos if info.status in (Status.TORN, Status.CORRUPT) or _corrupt_manifest(info)]
    committed = [info for info in infos if info.manifest is not None]
    if as_json:
        out.write(_as_json(store.url, infos, newest) + "\n")
    else:
        out.write(f"{store.url}\n")
        out.write((format_rows(infos) if infos else "no checkpoints") + "\n")
        if newest:
            out.write(f"newest restorable: global_step {newest.global_step} ({newest.path})\n")
        else:
            out.write("newest restorable: none\n")
        if bad:
            noun = "checkpoint" if len(bad) == 1 else "checkpoints"
            out.write(f"{len(bad)} committed {noun} failed {'verification' if hash else 'the listing check'}\n")
        elif not committed:
            out.write(f"no committed checkpoint under {store.url}\n")
    return EXIT_FAILURE if bad or not committed else EXIT_OK


def ls_command(url: str, storage_options: Mapping[str, Any] | None, *, as_json: bool,
               out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``verify`` without hashing: statuses from the listing and manifests only."""
    return verify_command(url, storage_options, as_json=as_json, hash=False, out=out, err=err)
