"""What a chaos scenario is: which faults, where, and what to expect.

A scenario is data (frozen dataclasses), so the soak run can compose new ones and the
catalogue can live outside the package: one TOML file per scenario in the repository's
``chaos/scenarios/``, loaded and validated by :mod:`resilient_train.chaos.catalogue`
(the format: ``chaos/README.md``). Three kinds of fault, chosen by how exactly they must land:

* :class:`WorkerFault` is pulled by the worker itself (``RT_FAULTS``: after a step,
  before or after a commit, an exception, its input's n-th batch) at an exact global step
  of an exact attempt. The signal is real (``os.kill`` on its own pid), so the supervisor
  sees a real death; or the fault hangs (``signal="HANG"``): the thread that pulled it
  blocks forever with the process alive, which only the progress watchdog can end.
  A ``before_join`` fault kills nothing: on its attempt the rank probes closed ports in
  place of its peers at start-up, so the worker's own reachability check fails.
  An ``input`` fault needs the input pipeline to pull it: the harness runs such a
  scenario on a recipe it generates around the job's (the same batches, one gate each).
* :class:`ExternalFault` is done to the job from outside by the nemesis (SIGKILL/SIGTERM
  a worker or the supervisor, corrupt the newest checkpoint, kill the chief while an
  upload is in flight). It fires on a :class:`Trigger` read from the job's own event
  stream ("after the 2nd ``checkpoint_committed`` of attempt 1, once a step past it has
  finished mid-epoch"), so it lands at the same point on a slow or a fast machine.
  ``throttle_worker`` slows a worker for real, not in its code: from then on the nemesis stops
  the process (SIGSTOP, every thread, and its children) for ``stop_ms`` and lets it run
  (SIGCONT) for ``run_ms``, over and over until it exits (about half speed at 50/50): what a
  CPU quota does (cgroup ``cpu.cfs_quota_us`` takes the CPU away in slices of its 100 ms
  period), without needing root or a cgroup. The straggler detector must name it.
* :class:`StorageFaults` configures the fault-injecting filesystem (``faulty://``) per
  attempt: transient errors at a rate, a torn upload, latency.

Random choices (which worker, which commit) are symbolic here (``rank="random"``) and
resolved by :func:`plan` from ``random.Random(seed)``: one seed, one fault plan.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any, Union

__all__ = [
    "WorkerFault", "ExternalFault", "StorageFaults", "Trigger", "Scenario",
    "plan", "random_scenario", "PARAMETER_SERVER", "EVERY_ATTEMPT",
]

PARAMETER_SERVER = "parameter-server"  # Scenario.job's strategy for the ParameterServerStrategy tier
HANG = "HANG"  # not a signal: the thread that pulls the fault sleeps forever (runner/failures/faults.py)
SIGNALS = ("SIGKILL", "SIGTERM", "SIGSTOP", HANG)
KILL_POINTS = ("after_step", "before_commit", "after_commit", "raise")
# input: the global_step-th batch the rank's input pipeline reads in its process (counting the
# chief's extra read of each epoch's first batch, and the prefetch that runs two batches ahead)
WORKER_POINTS = KILL_POINTS + ("input",)
# before_join: at start-up the rank probes a closed port on 127.0.0.1 for each peer (global_step 0)
WORKER_POINTS = WORKER_POINTS + ("before_join",)
# nan_loss: the rank's loss is NaN at that global step (runner/health/injection.py); the default
# --on-anomaly rollback replays it from the newest commit (no signal: the worker exits 1 itself)
WORKER_POINTS = WORKER_POINTS + ("nan_loss",)
# bitflip: one exponent bit of the rank's copy of the weights flipped after that global step
# (runner/health/injection.py); the replicas' comparison finds it at the next check (runner/health/replicas.py)
WORKER_POINTS = WORKER_POINTS + ("bitflip",)
# loss_spike: the rank's loss times 100 at that global step (a poisoned batch), for --loss-spike
WORKER_POINTS = WORKER_POINTS + ("loss_spike",)
# slow: the rank's host loop sleeps factor - 1 times each call's duration after that global step, for
# the rest of the attempt (runner/health/injection.py); the straggler detector names it (runner/health/stragglers.py)
WORKER_POINTS = WORKER_POINTS + ("slow",)
# attempt = "all": armed in every attempt. Only for a poisoned batch (its step's loss NaN or 100x whenever
# it is trained): the replay meets it again, so it is deterministic and its batch is skipped.
EVERY_ATTEMPT = "all"
POISON_POINTS = ("nan_loss", "loss_spike")
NUMERICAL_POINTS = POISON_POINTS + ("bitflip",)  # a run under these must commit no non-finite tensor
EXTERNAL_OPS = (
    "sigkill_worker",       # kill -9 one worker (rank given, "chief" = 0, or "random")
    "sigterm_worker",       # graceful preemption of one worker
    "sigkill_supervisor",   # kill -9 the supervisor (workers die by parent-death signal), then re-run
    "sigterm_supervisor",   # graceful preemption of the whole job (exit 143), then re-run
    "corrupt_newest",       # flip one byte in a data file of the newest committed checkpoint
    "sigkill_during_upload",  # kill -9 the chief while a checkpoint directory has files but no manifest
    "throttle_worker",      # SIGSTOP/SIGCONT one worker (and its children) in a duty cycle to the end of its attempt
)


@dataclass(frozen=True)
class Trigger:
    """When an external fault fires, from the job's event stream.

    After the ``nth`` ``event`` (counting only events of ``attempt``, or of any attempt
    when None); with ``mid_epoch``, additionally wait until a worker of that attempt has
    finished a step past the event's ``global_step`` that is not an epoch end.
    """

    event: str = "checkpoint_committed"
    nth: int | str = 1  # an int, or "random" (1..max_nth)
    attempt: int | None = 1
    mid_epoch: bool = True
    max_nth: int = 3

    def __post_init__(self) -> None:
        if not (self.nth == "random" or (isinstance(self.nth, int) and self.nth >= 1)):
            raise ValueError(f"Received nth={self.nth!r}; expected an int >= 1 or 'random'")

    def describe(self) -> str:
        where = f" of attempt {self.attempt}" if self.attempt is not None else ""
        mid = ", mid-epoch" if self.mid_epoch else ""
        return f"after {_ordinal(self.nth)} {self.event}{where}{mid}"


@dataclass(frozen=True)
class WorkerFault:
    point: str
    global_step: int
    rank: int | str = 0
    attempt: int | str = 1  # or EVERY_ATTEMPT (a poisoned batch: POISON_POINTS only)
    signal: str = "SIGKILL"
    factor: float = 1.0  # slow: how many times slower; loss_spike: times the loss (1: the injection's 100)

    def __post_init__(self) -> None:
        if self.point not in WORKER_POINTS:
            raise ValueError(f"Received point={self.point!r}; expected one of {WORKER_POINTS}")
        if self.attempt == EVERY_ATTEMPT and self.point not in POISON_POINTS:
            raise ValueError(f"Received attempt={self.attempt!r} with point={self.point!r}; expected an attempt "
                             f"number (every attempt only for a poisoned batch: {', '.join(POISON_POINTS)})")
        if self.signal not in SIGNALS:
            raise ValueError(f"Received signal={self.signal!r}; expected one of {SIGNALS}")
        if self.point == "input" and self.signal != HANG:
            raise ValueError(f"Received point='input' with signal={self.signal!r}; expected signal={HANG!r} "
                             "(an input pipeline thread can block, not die alone)")
        if self.point not in ("slow", "loss_spike") and self.factor != 1.0:
            raise ValueError(f"Received point={self.point!r} with factor={self.factor!r}; expected no factor (points "
                             "slow and loss_spike only)")
        if self.point == "slow" and not self.factor > 1:
            raise ValueError(f"Received point='slow' with factor={self.factor!r}; expected a factor > 1 (how many "
                             "times slower)")
        if self.point == "before_join" and (self.global_step != 0 or self.signal == HANG):
            raise ValueError(f"Received point='before_join' with global_step={self.global_step!r}, "
                             f"signal={self.signal!r}; expected global_step=0 and no HANG (nothing has run yet)")

    @property
    def hangs(self) -> bool:
        return self.signal == HANG

    @property
    def every_attempt(self) -> bool:
        return self.attempt == EVERY_ATTEMPT

    def describe(self) -> str:
        if self.point == "before_join":
            return f"rank {self.rank} cannot reach its peers at start-up (attempt {self.attempt})"
        if self.point == "input":
            return f"hang rank {self.rank}'s input at batch {self.global_step} (attempt {self.attempt})"
        if self.point in POISON_POINTS:
            what = "NaN loss" if self.point == "nan_loss" else f"a {100 if self.factor == 1 else self.factor:g}x loss"
            when = "every attempt: a poisoned batch" if self.every_attempt else f"attempt {self.attempt}"
            return f"{what} on rank {self.rank} at step {self.global_step} ({when})"
        if self.point == "slow":
            return f"rank {self.rank} {self.factor:g}x slower after step {self.global_step} (attempt {self.attempt})"
        if self.point == "bitflip":
            return f"a flipped bit in rank {self.rank}'s weights after step {self.global_step} (attempt {self.attempt})"
        what = "raise" if self.point == "raise" else "hang" if self.hangs else self.signal
        return f"{what} rank {self.rank} at {self.point} step {self.global_step} (attempt {self.attempt})"


@dataclass(frozen=True)
class ExternalFault:
    op: str
    trigger: Trigger = field(default_factory=Trigger)
    rank: int | str = 0
    stop_ms: int = 50  # throttle_worker only: how long each stop lasts
    run_ms: int = 50  # ... and each run between two stops

    def __post_init__(self) -> None:
        if self.op not in EXTERNAL_OPS:
            raise ValueError(f"Received op={self.op!r}; expected one of {EXTERNAL_OPS}")
        for name, value in (("stop_ms", self.stop_ms), ("run_ms", self.run_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Received {name}={value!r}; expected milliseconds, an integer >= 1")

    @property
    def reruns(self) -> bool:
        """The job's supervisor dies by this fault, so the harness runs the job again."""
        return self.op in ("sigkill_supervisor", "sigterm_supervisor")

    def describe(self) -> str:
        target = {"sigkill_supervisor": "supervisor", "sigterm_supervisor": "supervisor",
                  "corrupt_newest": "newest checkpoint", "sigkill_during_upload": "chief"}.get(
            self.op, f"rank {self.rank}")
        if self.op == "throttle_worker":
            target += f" ({self.stop_ms} ms stopped / {self.run_ms} ms running)"
        return f"{self.op} {target} {self.trigger.describe()}"


@dataclass(frozen=True)
class StorageFaults:
    """Options of the fault-injecting filesystem (see resilient_train.chaos.faultfs).

    ``attempts``: the attempts (of the workers) that see the faults; None = all. The
    supervisor never does: its storage check runs before any attempt.
    """

    spec: tuple[tuple[str, Any], ...]
    attempts: tuple[int, ...] | None = (1,)

    @classmethod
    def of(cls, attempts: tuple[int, ...] | None = (1,), **spec: Any) -> "StorageFaults":
        from resilient_train.chaos.faultfs import FaultSpec

        FaultSpec(**spec)  # validates names and values now, not in a worker
        return cls(tuple(sorted(spec.items())), attempts)

    def describe(self) -> str:
        options = ", ".join(f"{k}={v}" for k, v in self.spec)
        scope = "all attempts" if self.attempts is None else "attempt " + ",".join(map(str, self.attempts))
        return f"faulty storage ({options}) in {scope}"


Fault = Union[WorkerFault, ExternalFault, StorageFaults]


@dataclass(frozen=True)
class Scenario:
    """A named set of faults plus what the job must look like under them.

    ``job`` overrides job parameters (e.g. ``save_every_steps``, ``hang_timeout``);
    ``expect_restored`` pins the exact restored steps (the seeds' experiment: ``(7,)``);
    ``expect_skipped`` the exact global steps whose batches the run skips (a poisoned batch:
    then the digest is compared with a re-run of the same job under the same faults, since
    a skipped batch changes the weights; see the harness); ``expect_events`` the exact
    sequence of some events (each a dict: ``event`` and the fields every such event must
    have, in order; every event of a name it lists is counted).
    A new kind of fault is a new dataclass in :data:`Fault` plus its branch in
    :func:`plan` (random choices), in the harness (how it is armed, whether it fired) and
    in the catalogue's file format (``catalogue.py``, ``chaos/README.md``).
    """

    name: str
    summary: str
    faults: tuple[Fault, ...]
    job: tuple[tuple[str, Any], ...] = ()
    expect_restored: tuple[int, ...] | None = None
    ci: bool = False
    source: str | None = field(default=None, compare=False, repr=False)  # the TOML file it came from
    expect_skipped: tuple[int, ...] | None = None
    expect_events: tuple[dict[str, Any], ...] = field(default=(), hash=False)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").isalnum():
            raise ValueError(f"Received name={self.name!r}; expected lowercase words joined by '-'")
        external = [f.op for f in self.faults if isinstance(f, ExternalFault)]
        if self.expect_skipped and external:
            raise ValueError(f"Received expect_skipped={list(self.expect_skipped)} with the external fault "
                             f"{external[0]!r}; expected worker and storage faults only (the run is compared with a "
                             "re-run of the same job, which repeats them)")

    @property
    def reruns(self) -> bool:
        """The digest's reference is a re-run of the same job under the same faults (a batch skipped)."""
        return bool(self.expect_skipped)

    @property
    def numerical(self) -> bool:
        """Faults that make a state unhealthy: every committed checkpoint's tensors are checked."""
        return any(isinstance(f, WorkerFault) and f.point in NUMERICAL_POINTS for f in self.faults)

    @property
    def overrides(self) -> dict[str, Any]:
        return dict(self.job)

    @property
    def expected_hangs(self) -> dict[int, int]:
        """attempt -> the rank the watchdog must name (of a planned scenario: ranks resolved)."""
        return {f.attempt: f.rank for f in self.faults if isinstance(f, WorkerFault) and f.hangs}

    @property
    def expected_unreachable(self) -> dict[int, int]:
        """attempt -> the rank that cannot reach its peers (``before_join``), which the root cause must name."""
        return {f.attempt: f.rank for f in self.faults if isinstance(f, WorkerFault) and f.point == "before_join"}

    @property
    def stalled_attempts(self) -> tuple[int, ...]:
        """The attempts whose store stalls for good (``stall_count=0``): each must end in a failed save."""
        attempts: set[int] = set()
        for f in self.faults:
            spec = dict(f.spec) if isinstance(f, StorageFaults) else {}
            if spec.get("stall_write_k") and spec.get("stall_count", 1) == 0 and spec.get("stall_s") is None:
                attempts.update(f.attempts or ())
        return tuple(sorted(attempts))

    @property
    def parameter_server(self) -> bool:
        """The job runs under ``--strategy parameter-server``: the checker's parameter-server mode."""
        return self.overrides.get("strategy") == PARAMETER_SERVER

    def ranks(self, workers: int) -> int:
        """How many ranks a job of ``workers`` workers has: ``workers``, or 1 + ps + workers."""
        return 1 + int(self.overrides.get("ps", 1)) + workers if self.parameter_server else workers

    @property
    def input_faults(self) -> bool:
        """The job must run on the harness's input-fault recipe (see the module docstring)."""
        return any(isinstance(f, WorkerFault) and f.point == "input" for f in self.faults)


def _ordinal(n: int | str) -> str:
    if not isinstance(n, int):
        return str(n)
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def plan(scenario: Scenario, seed: int, workers: int) -> Scenario:
    """``scenario`` with every random choice resolved from ``random.Random(seed)``.

    ``workers`` counts ranks: a parameter-server job's is ``scenario.ranks(N)``, and its
    ``"ps-worker"`` is a random one of the worker ranks (1 + ps .. the last).
    """
    rng = random.Random(f"{scenario.name}:{seed}")
    first_worker = 1 + int(scenario.overrides.get("ps", 1)) if scenario.parameter_server else 0

    def rank(value: int | str) -> int:
        if value == "random":
            return rng.randrange(workers)
        if value == "ps-worker" and scenario.parameter_server and first_worker < workers:
            return rng.randrange(first_worker, workers)
        if value == "chief":
            return 0
        if not isinstance(value, int) or not 0 <= value < workers:
            raise ValueError(f"Received rank={value!r} with workers={workers}; expected 0..{workers - 1}")
        return value

    resolved: list[Fault] = []
    for fault in scenario.faults:
        if isinstance(fault, WorkerFault):
            resolved.append(dataclasses.replace(fault, rank=rank(fault.rank)))
        elif isinstance(fault, ExternalFault):
            trigger = fault.trigger
            if trigger.nth == "random":
                trigger = dataclasses.replace(trigger, nth=rng.randint(1, trigger.max_nth))
            resolved.append(dataclasses.replace(fault, trigger=trigger, rank=rank(fault.rank)))
        elif "seed" not in dict(fault.spec):
            # The fault stream (which operations fail) follows the scenario's seed too.
            spec = dict(fault.spec, seed=rng.randrange(2**31))
            resolved.append(dataclasses.replace(fault, spec=tuple(sorted(spec.items()))))
        else:
            resolved.append(fault)
    return dataclasses.replace(scenario, faults=tuple(resolved))


def random_scenario(rng: random.Random, index: int, *, total_steps: int, save_every: int) -> Scenario:
    """A soak scenario: 1-3 faults drawn from the whole catalogue's kinds, at random points.

    At most one fault per attempt kills something (so triggers stay reachable), storage
    faults are transient or slow (a torn upload in every attempt would never finish).
    """
    faults: list[Fault] = []
    if rng.random() < 0.4:
        faults.append(rng.choice([
            StorageFaults.of(attempts=None, transient_rate=round(rng.uniform(0.02, 0.1), 3), seed=rng.randrange(1000)),
            StorageFaults.of(attempts=None, latency_s=round(rng.uniform(0.005, 0.03), 3)),
            StorageFaults.of(attempts=(1,), stop_after_files=rng.randint(1, 8)),
        ]))
    killing = rng.randint(1, 2)
    for attempt in range(1, killing + 1):
        latest = max(2, total_steps - 2 * save_every)
        kind = rng.choice(["worker", "external", "external"])
        if kind == "worker" and not any(isinstance(f, StorageFaults) and dict(f.spec).get("stop_after_files") for f in faults):
            point = rng.choice(KILL_POINTS)
            step = rng.randint(1, latest)
            if point in ("before_commit", "after_commit"):
                step = max(save_every, step - step % save_every)
            faults.append(WorkerFault(point, step, rank=rng.choice([0, "random"]), attempt=attempt))
        else:
            op = rng.choice(["sigkill_worker", "sigkill_worker", "sigterm_worker", "sigterm_supervisor",
                             "sigkill_supervisor"])
            # Attempt numbers keep counting across a supervisor re-run, so attempt 2 is always
            # the attempt after the first fault, whichever kind it was.
            faults.append(ExternalFault(op, Trigger(nth=rng.randint(1, 2), attempt=attempt), rank="random"))
    if rng.random() < 0.25 and not any(isinstance(f, ExternalFault) and f.reruns for f in faults):
        faults.append(ExternalFault("corrupt_newest", Trigger(event="gang_restart", nth=1, attempt=None, mid_epoch=False)))
    return Scenario(f"soak-{index}", "random faults: " + "; ".join(f.describe() for f in faults), tuple(faults))
