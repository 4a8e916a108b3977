"""The invariants a fault-tolerant run must keep, checked from what the run left behind.

Usable on any run directory, not only the chaos suite's (``python -m resilient_train.chaos check RUN_DIR
--reference DIGEST``): everything is read from ``events.jsonl``, ``summary.json``,
``attempt-<n>/`` and the checkpoint storage. The invariants:

1. ``exit``: the job completed (``summary.json`` status ``completed``; exit code 0 when
   the caller knows it).
2. ``digest``: the final ``weights_sha256`` equals the reference (uninterrupted) run's.
3. ``restore``: every ``restored`` step is a step committed earlier
   (``checkpoint_committed`` before it in the event stream) and is the newest committed
   one that verifies: the newest committed step minus those this attempt rejected
   (``checkpoint_rejected``). A rejection is itself a violation unless the step was
   corrupted on purpose (a ``chaos_fault_injected`` event with ``op="corrupt_newest"``).
   A ``fresh_start`` after something was committed is a violation.
4. ``lost_steps``: for each restart, the steps the crashed attempt finished past its last
   commit are at most ``save_every_steps`` when it crashed (SIGKILL, exception); twice that
   with ``checkpoint_mode="async"``, where one save may still be uploading when the kill
   lands; and 0 when it was preempted (the chief emitted ``preempted``: SIGTERM to a worker or to the
   supervisor). Steps thrown away because a corrupt checkpoint was skipped are counted in
   the total but are explained by invariant 3, not by the kill.
5. ``verify``: ``resilient-train verify`` on the storage exits 0, or reports exactly the
   corruption that was injected (and only while no later commit of that step claimed it
   good again).
6. ``orphans``: no worker process (pids from ``worker_started``) is still alive.
7. ``trajectory`` (with ``reference_run``, the reference's run dir): ``resilient-train diff``
   of the run against the reference finds the same weights at every committed step both
   made (``checkpoint_committed``'s ``weights_sha256``) and the same first batch in every
   epoch; else it names the first divergent committed step and the last that matched.
8. ``hang`` (with ``expected_hangs``, attempt -> rank): each attempt that was made to hang
   has exactly one ``hang_detected``, naming that rank, and the restart's root cause
   (``gang_restart``'s ``root_cause_rank``; ``summary.json``'s ``root_cause`` when it is
   the hang) names it too; no other attempt hung.
9. ``stall`` (with ``stalled_attempts``, the attempts whose store was made to stall): each
   such attempt ended in a failed save (``checkpoint_failed``) whose error names the stall
   (``TimeoutError: ... made no progress ... (storage stalled)``), was followed by a ``gang_restart`` blaming
   the chief, and did not hang (no ``hang_detected``); ``summary.json``'s root cause is that
   storage failure (a ``StorageUnavailableError`` naming the stall), not a hang.
10. ``unreachable`` (with ``expected_unreachable``, attempt -> rank): the restart after each
   such attempt blames that rank, and ``summary.json``'s root cause is its
   ``PeerUnreachableError`` naming the rank and the ``host:port`` it could not reach.
11. ``fencing``: nothing committed by a fenced writer: no ``checkpoint_committed`` of an
   attempt after a newer attempt claimed its generation (``generation_claimed``; appends
   to the one events.jsonl are ordered), and none by a writer after it was told it is
   stale (``stale_writer_fenced``).
12. ``ps`` (parameter-server mode, chosen from the run dir: ``summary.json``'s or job.json's
   ``strategy`` is ``parameter-server``). Such a run is not bit-identical (workers update
   asynchronously), so invariant 2 is not checked, whatever ``reference`` says; instead
   exactly what the tier guarantees (docs/parameter_server.md): the final ``global_step``
   is ``epochs * steps_per_epoch``; no step is counted twice (the committed global steps
   strictly increase in commit order; the only repeat allowed is the completed final step
   committed again by an attempt that restored it); every manifest's ``updates_applied``
   is at least its ``global_step`` (closures run at least once). With ``expected_ps_kills``
   (attempt -> the rank killed): a killed worker costs no gang restart (no ``gang_restart``,
   no ``restored``, ``summary.json`` ``restarts`` 0, ``worker_restarts`` >= 1); a killed ps
   or coordinator is the root cause of the restart after its attempt and of ``summary.json``.
   Invariants 3 (each restore is the newest commit), 4 (lost steps: the coordinator's step
   marker counts scheduled steps, an upper bound) and 11 (fencing) hold as for MWMS runs.
13. ``rescue`` (runs with the memory tier, ``--snapshot-every``): a crashed attempt whose
   survivor committed a rescue (``rescue_committed``) is restored from that rescue (or a
   newer commit) and loses at most the tier's snapshot interval (``memory_tier``'s
   ``every_steps``, the largest after ``snapshot_interval_revised``) past it, not a save
   interval; with ``auto``, whose snapshots wait for the end of the call that reaches the
   interval, plus the attempt's longest call (``train_progress``'s ``steps_per_call``).

14. ``skips`` (a run that skipped batches: ``replay_verdict`` with action ``skip``, runner/health/
   anomaly_policy.py): each skipped step has a ``batch_skipped`` after its verdict, and every committed
   checkpoint still stored lists in its manifest's ``skipped_steps`` exactly the skipped steps up to its
   own step (a resume from any of them skips what the run skipped). Invariant 7 then allows the
   trajectory to diverge from the reference's from the first skipped step on (``resilient-train diff``
   names the run's skips): the batch skipped is the difference. Invariant 2 still compares the final
   digest with ``reference``, which for such a run is a re-run of the same job (the harness's).
15. ``finite`` (with ``check_finite``; by default when the run detected an anomaly, ``anomaly_detected``):
   no committed checkpoint still stored holds a non-finite floating tensor (each is fetched and read
   whole; retention's deleted ones cannot be, so the chaos scenarios that inject NaNs keep them all).

Why from artefacts: a checker that asks the supervisor how it did would trust the thing
under test. The attempt's reached step comes from ``attempt_reached`` or, when the
supervisor was SIGKILLed and never wrote it, from the workers' step markers and error files
(``attempt-<n>/step-<rank>.txt``; rundir/stepmarker.py ``reached_step``), so kills of the
supervisor are counted too.
"""

from __future__ import annotations

import ast
import datetime as dt
import io
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from resilient_train.rundir.events import read_events
from resilient_train.rundir.layout import RunDir
from resilient_train.rundir.stepmarker import reached_step

__all__ = ["CheckResult", "RestartRecord", "check_run", "load_events", "inner_storage_url",
           "trajectory_check", "hang_checks", "stall_checks", "unreachable_checks", "fencing_checks",
           "ps_checks", "skip_checks", "finite_checks", "is_parameter_server", "PARAMETER_SERVER"]

INJECTED_EVENT = "chaos_fault_injected"
PARAMETER_SERVER = "parameter-server"


@dataclass(frozen=True)
class RestartRecord:
    """One attempt boundary: how attempt ``attempt - 1`` ended and what ``attempt`` restored."""

    attempt: int
    ended_by: str  # "crash" | "preemption"
    reached: int
    newest_committed: int | None
    restored: int | None
    lost: int
    allowed: int

    def __post_init__(self) -> None:
        if self.ended_by not in ("crash", "preemption"):
            raise ValueError(f"Received ended_by={self.ended_by!r}; expected 'crash' or 'preemption'")


@dataclass(frozen=True)
class CheckResult:
    run_dir: str
    violations: tuple[str, ...]
    restarts: int
    lost_steps: int
    digest: str | None
    digest_match: bool
    checkpoints_verified: int
    checkpoints_bad: tuple[str, ...]
    restored_steps: tuple[int, ...]
    restart_records: tuple[RestartRecord, ...] = field(default=())
    # From ``resilient-train diff`` against the reference run (all None: not compared; no divergent
    # step or epoch: identical, last_matching_step is then the last common committed step).
    first_divergent_step: int | None = None
    last_matching_step: int | None = None
    first_divergent_epoch: int | None = None
    hangs: tuple[dict[str, Any], ...] = ()  # each hang_detected: attempt, rank, global_step, seconds, where
    strategy: str = "mirrored"  # "parameter-server": invariant 12 instead of the digest (never compared)
    skipped_steps: tuple[int, ...] = ()  # the batches the run skipped (invariant 14)
    finite_checked: tuple[int, ...] = ()  # the committed steps whose tensors were read (invariant 15)

    @property
    def passed(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["passed"] = self.passed
        return record


# ----------------------------------------------------------------------------- reading


load_events = read_events  # the checker's public name for the shared reader


def inner_storage_url(url: str) -> str:
    """``faulty:///x`` -> ``/x``; ``faulty://s3://b/p`` -> ``s3://b/p``; others unchanged.

    The end-of-run verification must read the storage itself, not through fault injection.
    """
    if url.startswith("faulty://"):
        return url[len("faulty://"):]  # "/abs", "rel/path" (cwd-relative, as the job saw it) or "s3://..."
    return url


def _job_value(run_dir: Path, key: str) -> Any:
    """``key`` from the newest attempt's job.json (None when unset there)."""
    jobs = [attempt.job for attempt in RunDir(run_dir).attempts() if attempt.job.exists()]
    for path in reversed(jobs):
        try:
            value = json.loads(path.read_text()).get(key)
        except (OSError, ValueError):
            continue
        if value is not None:
            return value
    return None


def recipe_default(recipe_path: str | None, key: str) -> int | None:
    """``DEFAULTS[key]`` of a recipe file, read without importing it (no TensorFlow)."""
    if not recipe_path or not Path(recipe_path).is_file():
        return None
    tree = ast.parse(Path(recipe_path).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DEFAULTS" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return value.get(key) if isinstance(value, dict) else None
    return None


# ----------------------------------------------------------------------------- invariants


def _restore_checks(
    records: list[dict[str, Any]], corrupted: set[int], save_every: int, reached_of: Mapping[int, int | None],
    violations: list[str],
) -> tuple[list[int], list[RestartRecord]]:
    committed: set[int] = set()
    rejected_by_attempt: dict[int, set[int]] = {}
    preempted_attempts: set[int] = set()
    restored_steps: list[int] = []
    restarts: list[RestartRecord] = []
    for record in records:
        event = record["event"]
        attempt = record.get("attempt")
        if event == "checkpoint_committed":
            committed.add(record["global_step"])
        elif event == "checkpoint_rejected":
            step = record.get("global_step")
            rejected_by_attempt.setdefault(attempt, set()).add(step)
            if step not in corrupted:
                violations.append(
                    f"restore: attempt {attempt} rejected checkpoint {step} ({record.get('reason')}), "
                    "which was not corrupted on purpose"
                )
        elif event == "preempted" and record.get("role") == "chief":
            preempted_attempts.add(attempt)
        elif event == "fresh_start" and (attempt or 1) > 1:
            if committed:
                violations.append(
                    f"restore: attempt {attempt} started from step 0 although steps {sorted(committed)} were committed"
                )
            else:  # the previous attempt died before its first commit: everything it did is lost
                previous = attempt - 1
                reached = reached_of.get(previous) or 0
                ended_by, allowed = ("preemption", 0) if previous in preempted_attempts else ("crash", save_every)
                restarts.append(RestartRecord(attempt, ended_by, reached, None, 0, reached, allowed))
                if reached > allowed:
                    violations.append(
                        f"lost_steps: attempt {previous} ended by {ended_by} at step {reached} before any commit; "
                        f"{reached} steps were lost, allowed {allowed}"
                    )
        elif event == "restored":
            step = record["global_step"]
            restored_steps.append(step)
            if step not in committed:
                violations.append(
                    f"restore: attempt {attempt} restored step {step}, never committed before "
                    f"(committed: {sorted(committed)})"
                )
            usable = committed - rejected_by_attempt.get(attempt, set())
            newest = max(usable) if usable else None
            if newest is not None and step != newest:
                violations.append(
                    f"restore: attempt {attempt} restored step {step}, but the newest committed checkpoint "
                    f"that verifies is {newest}"
                )
            newest_any = max(committed) if committed else None
            previous = (attempt or 1) - 1
            reached = reached_of.get(previous)
            reached = step if reached is None else max(reached, step)
            ended_by, allowed = ("preemption", 0) if previous in preempted_attempts else ("crash", save_every)
            # What the kill itself cost: steps past the newest commit. A skipped corrupt
            # checkpoint costs more, but that is invariant 3's business, not the kill's.
            kill_loss = reached - (newest_any if newest_any is not None else 0)
            restarts.append(RestartRecord(attempt or 0, ended_by, reached, newest_any, step, reached - step, allowed))
            if kill_loss > allowed:
                violations.append(
                    f"lost_steps: attempt {previous} ended by {ended_by} at step {reached}; "
                    f"{kill_loss} steps past the last commit were lost, allowed {allowed}"
                )
    return restored_steps, restarts


def verify_storage(url: str, storage_options: Mapping[str, Any] | None) -> tuple[int, list[dict[str, Any]], str]:
    """``resilient-train verify --json`` in-process: (exit code, checkpoint rows, stderr)."""
    from resilient_train.commands.verify import verify_command

    out, err = io.StringIO(), io.StringIO()
    code = verify_command(url, storage_options, as_json=True, hash=True, out=out, err=err)
    try:
        checkpoints = json.loads(out.getvalue())["checkpoints"]
    except (ValueError, KeyError):
        checkpoints = []
    return code, checkpoints, err.getvalue().strip()


def _survivors(records: Iterable[Mapping[str, Any]]) -> list[str]:
    import psutil

    alive = []
    for record in records:
        if record.get("event") not in ("worker_started", "worker_restarted"):  # restarted: in place (ps tier)
            continue
        pid = record["pid"]
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            started = dt.datetime.fromisoformat(record["ts"]).timestamp()
            # A pid reused by a process born later is not our worker.
            if process.create_time() > started + 2.0:
                continue
            cmdline = " ".join(process.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError):
            continue
        if "resilient_train" in cmdline:
            alive.append(f"rank {record.get('rank')} attempt {record.get('attempt')} pid {pid}")
    return alive


def trajectory_check(run_dir: Path, reference_run: Path, violations: list[str]) -> Any:
    """``resilient-train diff reference_run run_dir``; returns its Divergence, None when unreadable.

    A divergence from the first batch the run skipped (and the reference did not) on is explained
    by the skip (invariant 14), not a violation."""
    from resilient_train.commands.diff import compare_trajectories, load_trajectory
    from resilient_train.errors import StorageError

    try:
        result = compare_trajectories(load_trajectory(str(reference_run), {}), load_trajectory(str(run_dir), {}))
    except (ValueError, StorageError) as exc:
        violations.append(f"trajectory: cannot compare with the reference run {reference_run}: {exc}")
        return None
    skipped_from = min(result.skipped_b) if result.skipped_b else None
    if result.first_divergent_step is not None and skipped_from is not None \
            and result.first_divergent_step >= skipped_from:
        pass  # the run skipped the batch of skipped_from: its weights differ from there on, by design
    elif result.first_divergent_step is not None:
        last = result.last_matching_step
        violations.append(
            f"trajectory: the weights diverge from the reference run at committed global step "
            f"{result.first_divergent_step} (last matching step: {last if last is not None else 'none'})"
        )
    elif not result.common_steps:
        violations.append(f"trajectory: no committed step in common with the reference run {reference_run}")
    if result.first_divergent_epoch is not None:
        violations.append(f"trajectory: epoch {result.first_divergent_epoch}'s first batch differs from the reference run's")
    return result


def skip_checks(records: list[dict[str, Any]], manifests: Iterable[tuple[int, Mapping[str, Any]]],
                violations: list[str]) -> tuple[int, ...]:
    """Invariant 14 (see the module docstring); returns the skipped global steps (the skip verdicts')."""
    verdicts = [(index, int(r["global_step"])) for index, r in enumerate(records)
                if r["event"] == "replay_verdict" and r.get("action") == "skip" and isinstance(r.get("global_step"), int)]
    skipped = tuple(sorted({step for _, step in verdicts}))
    for index, step in verdicts:
        if not any(r["event"] == "batch_skipped" and r.get("global_step") == step for r in records[index:]):
            violations.append(f"skips: the batch of global step {step} was to be skipped (replay_verdict action "
                              "skip), but no batch_skipped of that step followed")
    for global_step, extra in manifests:
        listed = extra.get("skipped_steps", [])
        expected = [step for step in skipped if step <= global_step]
        if not isinstance(listed, list) or sorted(listed) != expected:
            violations.append(f"skips: checkpoint {global_step}'s manifest lists skipped_steps {listed!r}, expected "
                              f"{expected} (the run's skipped steps up to its step)")
    return skipped


def _committed_manifests(storage: str, storage_options: Mapping[str, Any] | None,
                         violations: list[str], what: str) -> list[tuple[int, Mapping[str, Any]]]:
    """(global_step, manifest extra) of every committed checkpoint that verifies, oldest first."""
    from resilient_train.checkpoint import CheckpointStore
    from resilient_train.checkpoint.store import Status
    from resilient_train.errors import StorageError

    try:
        return [(info.global_step, info.manifest.extra)
                for info in CheckpointStore(inner_storage_url(storage), storage_options, emit=_quiet).list()
                if info.status is Status.OK and info.manifest is not None]
    except (StorageError, OSError, ValueError) as exc:  # a bad run's storage is reported, never raised
        violations.append(f"{what}: cannot list the manifests at {storage}: {type(exc).__name__}: {exc}")
        return []


def _quiet(*args: Any, **fields: Any) -> None:
    """The checker's stores emit nothing (a fetch is not the run's event)."""


def finite_checks(storage: str, storage_options: Mapping[str, Any] | None, violations: list[str]) -> tuple[int, ...]:
    """Invariant 15 (see the module docstring); returns the global steps whose tensors were read."""
    import tempfile

    import numpy as np
    import tensorflow as tf

    from resilient_train.checkpoint import CheckpointStore
    from resilient_train.checkpoint.store import Status
    from resilient_train.errors import CheckpointCorruptError, StorageError

    checked = []
    try:
        store = CheckpointStore(inner_storage_url(storage), storage_options, emit=_quiet)
        infos = [info for info in store.list() if info.status is Status.OK]
    except (StorageError, OSError, ValueError) as exc:
        violations.append(f"finite: cannot list the checkpoints at {storage}: {type(exc).__name__}: {exc}")
        return ()
    for info in infos:
        with tempfile.TemporaryDirectory(prefix="rt-chaos-finite-") as scratch:
            try:
                _, local = store.fetch(info.global_step, Path(scratch))
                reader = tf.train.load_checkpoint(str(local / "ckpt"))
                bad = sorted(name for name, dtype in reader.get_variable_to_dtype_map().items()
                             if dtype.is_floating and not np.isfinite(reader.get_tensor(name)).all())
            except (CheckpointCorruptError, StorageError, OSError, ValueError, tf.errors.OpError) as exc:
                violations.append(f"finite: cannot read committed checkpoint {info.global_step}: "
                                  f"{type(exc).__name__}: {exc}")
                continue
        checked.append(info.global_step)
        if bad:
            violations.append(f"finite: committed checkpoint {info.global_step} holds non-finite values in "
                              f"{', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}")
    return tuple(checked)


def hang_checks(
    records: list[dict[str, Any]], summary: Mapping[str, Any], expected: Mapping[int, int], violations: list[str],
) -> list[dict[str, Any]]:
    """Invariant 8 (see the module docstring); returns the hang_detected records."""
    hangs = [r for r in records if r["event"] == "hang_detected"]
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for hang in hangs:
        by_attempt.setdefault(hang.get("attempt"), []).append(hang)
    for attempt, found in sorted(by_attempt.items(), key=lambda item: item[0] or 0):
        if attempt not in expected:
            violations.append(f"hang: attempt {attempt} hung (rank {found[0].get('rank')} named, "
                              f"{found[0].get('where')}) and nothing made it hang")
    for attempt, rank in sorted(expected.items()):
        found = by_attempt.get(attempt, [])
        if len(found) != 1:
            violations.append(f"hang: attempt {attempt} was made to hang on rank {rank}; "
                              f"{len(found)} hang_detected events, expected 1")
            continue
        named = found[0].get("rank")
        if named != rank:
            violations.append(f"hang: attempt {attempt} hung on rank {rank}, but the watchdog named rank {named} "
                              f"({found[0].get('chosen_by')}; {found[0].get('where')})")
        restart = next((r for r in records if r["event"] == "gang_restart" and r.get("attempt") == attempt + 1), None)
        if restart is None:
            violations.append(f"hang: no gang_restart after attempt {attempt} hung")
        elif restart.get("root_cause_rank") != rank:
            violations.append(f"hang: the restart after attempt {attempt} blames rank {restart.get('root_cause_rank')}, "
                              f"expected rank {rank}")
    root = summary.get("root_cause") or {}
    if root.get("type") == "Hang" and root.get("attempt") in expected:
        rank = expected[root["attempt"]]
        if root.get("rank") != rank:
            violations.append(f"hang: summary.json's root cause names rank {root.get('rank')}, expected rank {rank}")
    return hangs


STALL_WORDS = "(storage stalled)"  # checkpoint/deadline.py's TimeoutError, carried into the save's failure
_UNREACHABLE = re.compile(r"^rank (\d+) \(\S+\) could not reach rank \d+(?: \(chief\))? at (\S+:\d+) ")


def _names_stall(error: str) -> bool:
    return "TimeoutError" in error and STALL_WORDS in error


def _restart_after(records: list[dict[str, Any]], attempt: int) -> dict[str, Any] | None:
    return next((r for r in records if r["event"] == "gang_restart" and r.get("attempt") == attempt + 1), None)


def stall_checks(
    records: list[dict[str, Any]], summary: Mapping[str, Any], stalled: Iterable[int], violations: list[str],
) -> None:
    """Invariant 9 (see the module docstring)."""
    stalled = sorted(set(stalled))
    for attempt in stalled:
        failed = [r for r in records if r["event"] == "checkpoint_failed" and r.get("attempt") == attempt]
        if not any(_names_stall(str(r.get("error"))) for r in failed):
            errors = "; ".join(str(r.get("error")) for r in failed) or "none"
            violations.append(f"stall: attempt {attempt}'s store was stalled, but no checkpoint_failed names the stall "
                              f"(checkpoint_failed errors: {errors})")
        hung = [r for r in records if r["event"] == "hang_detected" and r.get("attempt") == attempt]
        if hung:
            violations.append(f"stall: attempt {attempt} was declared hung (rank {hung[0].get('rank')}), "
                              "but its save should have failed on the storage deadline first")
        restart = _restart_after(records, attempt)
        if restart is None:
            violations.append(f"stall: no gang_restart after attempt {attempt}'s save failed")
        elif restart.get("root_cause_rank") != 0:
            violations.append(f"stall: the restart after attempt {attempt} blames rank "
                              f"{restart.get('root_cause_rank')}, expected the chief (rank 0), whose save failed")
    if not stalled:
        return
    root = summary.get("root_cause") or {}
    if root.get("attempt") not in stalled or not str(root.get("type")).endswith("StorageUnavailableError") \
            or not _names_stall(str(root.get("message"))):
        violations.append(f"stall: summary.json's root cause is {root.get('type')} of attempt {root.get('attempt')} "
                          f"({root.get('message')}), expected the storage failure naming the stall")


def unreachable_checks(
    records: list[dict[str, Any]], summary: Mapping[str, Any], expected: Mapping[int, int], violations: list[str],
) -> None:
    """Invariant 10 (see the module docstring)."""
    for attempt, rank in sorted(expected.items()):
        restart = _restart_after(records, attempt)
        if restart is None:
            violations.append(f"unreachable: no gang_restart after attempt {attempt}, where rank {rank} could not "
                              "reach its peers")
        elif restart.get("root_cause_rank") != rank:
            violations.append(f"unreachable: the restart after attempt {attempt} blames rank "
                              f"{restart.get('root_cause_rank')}, expected rank {rank}, which could not reach its peers")
    if not expected:
        return
    root = summary.get("root_cause") or {}
    attempt = root.get("attempt")
    match = _UNREACHABLE.match(str(root.get("message") or ""))
    if attempt not in expected or not str(root.get("type")).endswith("PeerUnreachableError"):
        violations.append(f"unreachable: summary.json's root cause is {root.get('type')} of attempt {attempt} "
                          f"({root.get('message')}), expected a PeerUnreachableError")
    elif root.get("rank") != expected[attempt] or match is None or int(match.group(1)) != expected[attempt]:
        violations.append(f"unreachable: summary.json's root cause (rank {root.get('rank')}: {root.get('message')}) "
                          f"does not name rank {expected[attempt]} and the host:port it could not reach")


def fencing_checks(records: list[dict[str, Any]], violations: list[str]) -> None:
    """Invariant 11 (see the module docstring)."""
    newest_claim = 0  # the highest attempt that claimed a generation so far
    fenced: set[Any] = set()
    for record in records:
        event, attempt = record["event"], record.get("attempt")
        if event == "generation_claimed" and isinstance(attempt, int):
            newest_claim = max(newest_claim, attempt)
        elif event == "stale_writer_fenced":
            fenced.add(attempt)
        elif event == "checkpoint_committed":
            step = record.get("global_step")
            if attempt in fenced:
                violations.append(f"fencing: attempt {attempt} committed step {step} after it was fenced")
            elif isinstance(attempt, int) and attempt < newest_claim:
                violations.append(f"fencing: attempt {attempt} committed step {step} after attempt {newest_claim} "
                                  "claimed a newer generation (a stale writer's commit)")


def rescue_checks(records: list[dict[str, Any]], restarts: list[RestartRecord], violations: list[str]) -> None:
    """13: a crash rescued by a survivor restores the rescue and loses at most the snapshot interval."""
    every: dict[int, int] = {}
    for r in records:
        if r["event"] in ("memory_tier", "snapshot_interval_revised") and isinstance(r.get("every_steps"), int):
            every[r["attempt"]] = max(r["every_steps"], every.get(r["attempt"], 0))
    auto = {r["attempt"] for r in records if r["event"] == "memory_tier" and r.get("setting") == "auto"}
    longest_call: dict[int, int] = {}
    for r in records:
        if r["event"] == "train_progress" and r.get("attempt") in auto:
            longest_call[r["attempt"]] = max(r.get("steps_per_call", 1), longest_call.get(r["attempt"], 1))
    for attempt, steps in longest_call.items():
        if attempt in every:
            every[attempt] += steps
    rescued: dict[int, int] = {}
    for record in records:
        if record["event"] == "rescue_committed":
            rescued[record["attempt"]] = max(record["global_step"], rescued.get(record["attempt"], 0))
    for restart in restarts:
        previous = restart.attempt - 1
        if previous not in rescued or restart.ended_by != "crash":
            continue
        step, allowed = rescued[previous], every.get(previous)
        if restart.restored is None or restart.restored < step:
            violations.append(f"rescue: attempt {restart.attempt} restored step {restart.restored}, older than the "
                              f"rescue of step {step} committed in attempt {previous}")
        elif allowed is not None and restart.lost > allowed:
            violations.append(f"rescue: attempt {previous} reached step {restart.reached}; {restart.lost} steps past "
                              f"its rescue of step {restart.restored} were lost, allowed {allowed} (the snapshot interval"
                              f"{', plus the longest call (auto)' if previous in auto else ''})")


def is_parameter_server(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` is a ``--strategy parameter-server`` run (summary.json, else job.json)."""
    try:
        strategy = json.loads(RunDir(Path(run_dir)).summary.read_text()).get("strategy")
    except (OSError, ValueError):
        strategy = None
    return (strategy or _job_value(Path(run_dir), "strategy")) == PARAMETER_SERVER


def ps_checks(
    records: list[dict[str, Any]], summary: Mapping[str, Any], *, total_steps: int | None,
    manifests: Iterable[tuple[int, Mapping[str, Any]]], roles: Mapping[int, str],
    expected_kills: Mapping[int, int], violations: list[str],
) -> None:
    """Invariant 12 (see the module docstring). ``manifests``: (global_step, extra) of each
    committed checkpoint; ``roles``: rank -> role of the job's ranks."""
    final = summary.get("global_step")
    if total_steps is None:
        violations.append("ps: job.json has no epochs/steps_per_epoch; cannot check the final global_step")
    elif final != total_steps:
        violations.append(f"ps: final global_step is {final}, expected epochs * steps_per_epoch = {total_steps}")
    previous: int | None = None
    restored: dict[Any, int] = {}
    for record in records:
        event, attempt = record["event"], record.get("attempt")
        if event == "restored":
            restored[attempt] = record.get("global_step")
        elif event == "checkpoint_committed":
            step = record.get("global_step")
            repeat_of_final = step == previous == total_steps and restored.get(attempt) == step
            if previous is not None and step <= previous and not repeat_of_final:
                violations.append(f"ps: attempt {attempt} committed global_step {step} after {previous} was "
                                  "committed (a step counted twice)")
            previous = step if previous is None else max(previous, step)
    for step, extra in manifests:
        applied = extra.get("updates_applied")
        if not isinstance(applied, int) or applied < step:
            violations.append(f"ps: checkpoint {step}'s manifest has updates_applied={applied!r}, expected an "
                              f"int >= its global_step {step} (each step's closure ran at least once)")
    for attempt, rank in sorted(expected_kills.items()):
        role = roles.get(rank)
        if role == "worker":
            gang = [r.get("attempt") for r in records if r["event"] == "gang_restart"]
            again = [r.get("global_step") for r in records if r["event"] == "restored"]
            if gang or again or summary.get("restarts") != 0:
                violations.append(f"ps: killing worker rank {rank} in attempt {attempt} cost a gang restart "
                                  f"(gang_restart into attempts {gang}, restored {again}, summary restarts "
                                  f"{summary.get('restarts')}); expected a restart in place")
            restarted = [r for r in records if r["event"] == "worker_restarted" and r.get("rank") == rank
                         and r.get("attempt") == attempt]
            if not restarted or (summary.get("worker_restarts") or 0) < 1:
                violations.append(f"ps: worker rank {rank} killed in attempt {attempt}: {len(restarted)} "
                                  f"worker_restarted events for it, summary worker_restarts "
                                  f"{summary.get('worker_restarts')}; expected >= 1")
            continue
        restart = _restart_after(records, attempt)
        if restart is None:
            violations.append(f"ps: no gang_restart after {role} rank {rank} was killed in attempt {attempt}")
        elif restart.get("root_cause_rank") != rank:
            violations.append(f"ps: the restart after attempt {attempt} blames rank {restart.get('root_cause_rank')}, "
                              f"expected the killed {role}, rank {rank}")
        root = summary.get("root_cause") or {}
        if (root.get("rank"), root.get("attempt")) != (rank, attempt):
            violations.append(f"ps: summary.json's root cause is rank {root.get('rank')} of attempt "
                              f"{root.get('attempt')}, expected the killed {role}, rank {rank} of attempt {attempt}")


def _ps_context(run_dir: Path, storage: str | None, storage_options: Mapping[str, Any] | None,
                violations: list[str]) -> tuple[int | None, list[tuple[int, Mapping[str, Any]]], dict[int, str]]:
    """(epochs * steps_per_epoch, committed manifests' (global_step, extra), rank -> role) of a ps run."""
    from resilient_train.checkpoint import CheckpointStore
    from resilient_train.checkpoint.store import Status
    from resilient_train.cluster.ps_cluster import ps_task
    from resilient_train.errors import StorageError

    epochs, steps = _job_value(run_dir, "epochs"), _job_value(run_dir, "steps_per_epoch")
    total = int(epochs) * int(steps) if epochs and steps else None
    manifests: list[tuple[int, Mapping[str, Any]]] = []
    if storage:
        try:
            manifests = [(info.global_step, info.manifest.extra)
                         for info in CheckpointStore(inner_storage_url(storage), storage_options).list()
                         if info.status is Status.OK and info.manifest is not None]
        except (StorageError, OSError, ValueError) as exc:  # a bad run's storage is reported, never raised
            violations.append(f"ps: cannot list the manifests at {storage}: {type(exc).__name__}: {exc}")
    ps, workers = int(_job_value(run_dir, "ps") or 1), int(_job_value(run_dir, "workers") or 1)
    roles = {rank: ps_task(rank, ps, workers).role for rank in range(1 + ps + workers)}
    return total, manifests, roles


def check_run(
    run_dir: str | Path,
    reference: str | None,
    *,
    exit_code: int | None = None,
    save_every: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    check_orphans: bool = True,
    reference_run: str | Path | None = None,
    expected_hangs: Mapping[int, int] | None = None,
    stalled_attempts: Iterable[int] = (),
    expected_unreachable: Mapping[int, int] | None = None,
    expected_ps_kills: Mapping[int, int] | None = None,
    check_finite: bool | None = None,
) -> CheckResult:
    """Check every invariant of the module docstring on ``run_dir``; never raises for a bad run.

    Invariants 7 to 10 need ``reference_run``, ``expected_hangs``, ``stalled_attempts`` and
    ``expected_unreachable``; without them they are not checked (a user's run dir has
    neither a reference run nor a fault plan).
    """
    run_dir = Path(run_dir)
    violations: list[str] = []
    records = load_events(RunDir(run_dir).events)
    try:
        summary = json.loads(RunDir(run_dir).summary.read_text())
    except (OSError, ValueError):
        summary = {}

    # 1. exit
    if exit_code is not None and exit_code != 0:
        violations.append(f"exit: the job exited {exit_code}, expected 0")
    if summary.get("status") != "completed":
        violations.append(f"exit: summary.json status is {summary.get('status')!r}, expected 'completed'")

    # 2. digest (not for a parameter-server run: invariant 12 instead)
    parameter_server = is_parameter_server(run_dir)
    if parameter_server:
        reference = None
    digest = summary.get("weights_sha256")
    digest_match = reference is not None and digest == reference
    if reference is not None and not digest_match:
        violations.append(f"digest: final weights_sha256 {digest} != reference {reference}")

    # 3 + 4. restores and lost steps
    if save_every is None:
        save_every = _job_value(run_dir, "save_every_steps")
    if save_every is None:
        save_every = recipe_default(_job_value(run_dir, "recipe"), "save_every_steps") or 10
    steps_per_epoch = _job_value(run_dir, "steps_per_epoch") or recipe_default(
        _job_value(run_dir, "recipe"), "steps_per_epoch")
    if save_every == 0 or (steps_per_epoch and save_every > steps_per_epoch):
        save_every = steps_per_epoch or save_every  # only epoch-end saves
    # Async checkpointing (the default since the async runner landed) keeps training while
    # the previous save uploads; one save may be in flight when the kill lands, so a crash
    # may lose up to two intervals. Sync mode keeps the bound of one interval.
    mode = _job_value(run_dir, "checkpoint_mode") or "sync"
    if parameter_server:
        mode = "sync"  # the coordinator's saves are synchronous (runner/process/ps_roles.py), whatever the job says
    crash_allowance = save_every * (2 if mode == "async" else 1)
    reached_of: dict[int, int | None] = {}
    for attempt in RunDir(run_dir).attempts():
        reached_of[attempt.number] = reached_step(attempt.path)
    for record in records:
        if record["event"] == "attempt_reached":
            reached_of[record["attempt"]] = max(record["global_step"], reached_of.get(record["attempt"]) or 0)
    corrupted_at: dict[int, int] = {}  # step -> index of the injection event
    for index, record in enumerate(records):
        if record["event"] == INJECTED_EVENT and record.get("op") == "corrupt_newest" and record.get("global_step") is not None:
            corrupted_at[record["global_step"]] = index
    restored_steps, restarts = _restore_checks(records, set(corrupted_at), crash_allowance, reached_of, violations)
    lost = sum(r.lost for r in restarts)

    # 5. verify
    storage = summary.get("storage") or _job_value(run_dir, "storage")
    verified, bad = 0, []
    if storage:
        code, checkpoints, error = verify_storage(inner_storage_url(storage), storage_options)
        if code == 2:
            violations.append(f"verify: storage {storage} could not be read: {error}")
        verified = sum(1 for c in checkpoints if c["status"] == "ok")
        if not checkpoints and any(r["event"] == "checkpoint_committed" for r in records):
            violations.append(f"verify: no checkpoints at {inner_storage_url(storage)}, but the run committed some")
        for c in checkpoints:
            if c["status"] not in ("torn", "corrupt"):
                continue
            step = c["global_step"]
            bad.append(f"{step}: {c['status']}: {c['detail']}")
            injected = corrupted_at.get(step)
            recommitted = injected is not None and any(
                r["event"] == "checkpoint_committed" and r.get("global_step") == step for r in records[injected:]
            )
            if injected is None:
                violations.append(f"verify: checkpoint {step} is {c['status']} ({c['detail']}) and nothing injected that")
            elif recommitted:
                violations.append(
                    f"verify: checkpoint {step} is {c['status']} ({c['detail']}) although it was committed "
                    "again after the injected corruption (the re-commit kept the corrupt bytes)"
                )
    else:
        violations.append("verify: no storage URL in summary.json or job.json")

    # 6. orphans
    if check_orphans:
        for survivor in _survivors(records):
            violations.append(f"orphans: worker still alive after the run: {survivor}")

    # 14. skipped batches: the manifests agree with the skip verdicts
    skipped: tuple[int, ...] = ()
    finite_steps: tuple[int, ...] = ()
    if storage and not parameter_server:
        skipped = skip_checks(records, _committed_manifests(storage, storage_options, violations, "skips"), violations)

    # 15. nothing non-finite committed
    if check_finite is None:
        check_finite = any(r["event"] == "anomaly_detected" for r in records)
    if check_finite and storage:
        finite_steps = finite_checks(storage, storage_options, violations)

    # 7. trajectory
    divergence = trajectory_check(run_dir, Path(reference_run), violations) if reference_run is not None else None

    # 8. hang
    hangs = hang_checks(records, summary, expected_hangs, violations) if expected_hangs is not None else []

    # 9 + 10. a stalled store, a rank that could not reach its peers
    stall_checks(records, summary, stalled_attempts, violations)
    unreachable_checks(records, summary, expected_unreachable or {}, violations)

    # 11. fencing
    fencing_checks(records, violations)

    # 13. rescues (the memory tier)
    rescue_checks(records, restarts, violations)

    # 12. the parameter-server tier's guarantees
    if parameter_server:
        total, manifests, roles = _ps_context(run_dir, storage, storage_options, violations)
        ps_checks(records, summary, total_steps=total, manifests=manifests, roles=roles,
                  expected_kills=expected_ps_kills or {}, violations=violations)

    attempts = {r.get("attempt") for r in records if r["event"] == "worker_started"}
    return CheckResult(
        run_dir=str(run_dir),
        violations=tuple(violations),
        restarts=max(0, len(attempts) - 1),
        lost_steps=lost,
        digest=digest,
        digest_match=digest_match,
        checkpoints_verified=verified,
        checkpoints_bad=tuple(bad),
        restored_steps=tuple(restored_steps),
        restart_records=tuple(restarts),
        first_divergent_step=getattr(divergence, "first_divergent_step", None),
        last_matching_step=getattr(divergence, "last_matching_step", None),
        first_divergent_epoch=getattr(divergence, "first_divergent_epoch", None),
        strategy=PARAMETER_SERVER if parameter_server else "mirrored",
        skipped_steps=skipped,
        finite_checked=finite_steps,
        hangs=tuple({key: hang.get(key) for key in ("attempt", "rank", "global_step", "seconds", "chosen_by", "where")}
                    for hang in hangs),
    )


def render(result: CheckResult) -> str:
    lines = [
        f"run: {result.run_dir}",
        f"restarts: {result.restarts}  restored: {list(result.restored_steps)}  lost steps: {result.lost_steps}",
        f"digest: {result.digest} (" + ("not compared: a parameter-server run is bit-identical to no other"
                                         if result.strategy == PARAMETER_SERVER else
                                         f"{'matches' if result.digest_match else 'DOES NOT match'} the reference") + ")"
        + (f"; first divergent committed step {result.first_divergent_step} (last matching "
           f"{result.last_matching_step})" if result.first_divergent_step is not None else ""),
        f"checkpoints verified: {result.checkpoints_verified}"
        + (f"  bad: {'; '.join(result.checkpoints_bad)}" if result.checkpoints_bad else ""),
    ]
    if result.skipped_steps:
        lines.append(f"skipped batches: global steps {', '.join(map(str, result.skipped_steps))}")
    if result.finite_checked:
        lines.append(f"tensors read for non-finite values: committed steps {', '.join(map(str, result.finite_checked))}")
    for r in result.restart_records:
        lines.append(
            f"  attempt {r.attempt}: previous ended by {r.ended_by} at step {r.reached}, newest commit "
            f"{r.newest_committed}, restored {r.restored}, lost {r.lost} (allowed past last commit: {r.allowed})"
        )
    for hang in result.hangs:
        lines.append(f"  hang in attempt {hang['attempt']}: rank {hang['rank']} at global step {hang['global_step']} "
                     f"for {hang['seconds']} s ({hang['chosen_by']}); {hang['where']}")
    lines.append("PASS" if result.passed else "FAIL")
    lines.extend(f"  - {v}" for v in result.violations)
    return "\n".join(lines)
