"""Can a pre-formed standby group take over? Experiments with real MWMS groups on loopback (issue 33).

A *pre-formed standby group* is a complete group of standby workers that has already
created its MultiWorkerMirroredStrategy on its own ports, built the model and traced (and
run once) the training step while the current group trains; on a failure it only restores
the newest checkpoint into its built variables and goes on. This script answers, with real
processes and TensorFlow only (no supervisor, so that only TensorFlow's behaviour is
measured):

* ``second_group_forms``: does a second 2-worker MWMS group (its own ports and TF_CONFIG)
  form on this host while the first trains? Its formation times (strategy + registration,
  model, trace + one warm-up step).
* ``idle_then_restore``: does it survive sitting idle for ``--idle-s`` (longer than the
  coordination service's 10 s heartbeat timeout, runner/training/strategy.py), then, after the
  training group's chief is killed with SIGKILL, restore that group's newest checkpoint into its
  already-built variables and train on to step ``--steps`` **without tracing again**
  (``traces_after_go`` = 0) and with the **same weights digest** as a group that was never
  interrupted (``digest_matches``)? ``go_to_first_step_s``: the go signal -> its first step
  done (the restore, a new iterator at the restored step, one step).
* ``cost``: the standby group's processes, RSS, CPU seconds at formation, and the training
  group's steps/s before and while the standby group forms (``throughput_ratio``).
* ``standby_member_killed``: a standby group whose rank 1 is SIGKILLed while idle: when its
  rank 0's collectives are aborted (the coordination service's heartbeat), whether rank 0
  stays alive idle, and what it does when told to go anyway (exit code, TensorFlow error).

Usage::

    .venv/bin/python benchmarks/preformed_group.py [--steps 60] [--idle-s 25]

Writes ``benchmarks/results/preformed_group.json``. The worker side is this same file run
with ``--worker``; the model is a small dense regression on data generated from the step
number, so that any two runs of the same steps see the same batches.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import add_smoke_flag, check_smoke_out, write_result  # noqa: E402

RESULT_KEYS = ("benchmark", "date", "host", "setup", "reference", "second_group_forms", "idle_then_restore", "cost",
               "standby_member_killed", "answers", "wall_s", "smoke")
BATCH, FEATURES, SAVE_EVERY = 32, 16, 10


# ------------------------------------------------------------------ the worker side
def _worker(spec: dict[str, Any]) -> int:
    """One MWMS worker. ``spec``: mode (train | standby), rank, addresses, work, steps, ..."""
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": spec["addresses"]},
                                          "task": {"type": "worker", "index": spec["rank"]}})
    log = open(Path(spec["work"]) / f"{spec['name']}-{spec['rank']}.jsonl", "a", buffering=1)

    def say(event: str, **fields: Any) -> None:
        log.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")

    t0 = time.time()
    import keras
    import numpy as np
    import tensorflow as tf

    from resilient_train.runner.training.strategy import make_strategy

    class _Job:  # what make_strategy reads of a JobConfig
        startup_timeout, collective_timeout = 120.0, None

    class _Cluster:
        num_workers = len(spec["addresses"])

    say("imported", seconds=round(time.time() - t0, 3))
    t = time.time()
    strategy = make_strategy(_Job, _Cluster)
    say("strategy", seconds=round(time.time() - t, 3))
    t = time.time()
    keras.utils.set_random_seed(1234)
    tf.config.experimental.enable_op_determinism()
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        optimizer.build(model.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64, trainable=False)
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    say("model", seconds=round(time.time() - t, 3))
    workers, rank = len(spec["addresses"]), spec["rank"]
    traces = [0]

    def data(start: int):
        def per_worker(ctx):
            def batch(s):
                seed = tf.stack([s, tf.cast(ctx.input_pipeline_id, tf.int64)])
                x = tf.random.stateless_uniform([BATCH // workers, FEATURES], seed=seed)
                return x, tf.reduce_sum(x, axis=1, keepdims=True) * 0.5
            return tf.data.Dataset.range(start, 10**9).map(batch)
        return iter(strategy.distribute_datasets_from_function(per_worker))

    @tf.function
    def train_step(iterator):
        traces[0] += 1

        def step_fn(xy):
            x, y = xy
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(tf.square(model(x, training=True) - y), global_batch_size=BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        loss = strategy.reduce("SUM", strategy.run(step_fn, args=(next(iterator),)), axis=None)
        step.assign_add(1)
        return loss

    def digest() -> str:
        h = hashlib.sha256()
        for w in model.weights:
            h.update(np.ascontiguousarray(w.numpy()).tobytes())
        return h.hexdigest()

    def save_path(s: int) -> str:
        base = Path(spec["work"]) / spec["name"]
        return str(base / f"ckpt-{s}") if rank == 0 else str(base / f"tmp-{rank}" / f"ckpt-{s}")

    def train_to(iterator, last: int, *, saving: bool) -> None:
        first = True
        while int(step.numpy()) < last:
            train_step(iterator).numpy()
            s = int(step.numpy())
            if first:
                say("first_step", step=s, traces=traces[0])
                first = False
            if s % 10 == 0:
                say("progress", step=s)
            if saving and s % SAVE_EVERY == 0:
                ckpt.write(save_path(s))
                if rank == 0:
                    say("saved", step=s, path=save_path(s))

    if spec["mode"] == "train":
        train_to(data(0), spec["steps"], saving=True)
        say("done", step=int(step.numpy()), digest=digest(), traces=traces[0])
        return 0
    # standby: trace and run one warm-up step on its own variables (the restore overwrites
    # every variable it touched: weights, optimizer slots and iterations, the step)
    t = time.time()
    train_step(data(0)).numpy()
    say("traced", seconds=round(time.time() - t, 3), traces=traces[0])
    go = Path(spec["work"]) / f"{spec['name']}.go"
    while not go.exists():
        time.sleep(0.005)
    t_go = time.time()
    traces_before = traces[0]
    path = go.read_text().strip()
    ckpt.read(path).assert_consumed()
    restored = int(step.numpy())
    t_restored = time.time()
    iterator = data(restored)
    say("restored", step=restored, seconds=round(t_restored - t_go, 3), go_at=t_go)
    train_to(iterator, spec["steps"], saving=False)
    say("done", step=int(step.numpy()), digest=digest(), traces_after_go=traces[0] - traces_before)
    return 0


# ------------------------------------------------------------------ the driver
class Group:
    def __init__(self, name: str, mode: str, work: Path, steps: int, ports: list[int]) -> None:
        self.name, self.work = name, work
        addresses = [f"127.0.0.1:{p}" for p in ports]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
        env.pop("TF_CONFIG", None)
        self.procs = []
        for rank in range(len(ports)):
            spec = {"mode": mode, "name": name, "rank": rank, "addresses": addresses, "work": str(work), "steps": steps}
            out = open(work / f"{name}-{rank}.log", "wb")
            self.procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)],
                                               env=env, stdout=out, stderr=subprocess.STDOUT))

    def records(self, rank: int = 0) -> list[dict[str, Any]]:
        path = self.work / f"{self.name}-{rank}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait(self, event: str, timeout: float, rank: int = 0, where=lambda r: True) -> dict[str, Any]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for r in self.records(rank):
                if r["event"] == event and where(r):
                    return r
            for p in self.procs:
                if p.poll() not in (None, 0):
                    raise RuntimeError(f"{self.name}: a worker exited {p.returncode}: "
                                       f"{(self.work / f'{self.name}-{self.procs.index(p)}.log').read_text()[-2000:]}")
            time.sleep(0.02)
        raise TimeoutError(f"{self.name}: no {event} within {timeout} s")

    def log_tail(self, rank: int) -> str:
        return (self.work / f"{self.name}-{rank}.log").read_text(errors="replace")[-1500:]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def _steps_per_s(records: list[dict[str, Any]], t_from: float, t_to: float) -> float | None:
    points = [(r["t"], r["step"]) for r in records if r["event"] == "progress" and t_from <= r["t"] <= t_to]
    if len(points) < 2:
        return None
    return round((points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]), 2)


def _usage(pids: list[int]) -> dict[str, Any]:
    import psutil

    procs = [psutil.Process(p) for p in pids]
    return {"processes": len(procs), "rss_mb": [round(p.memory_info().rss / 2**20, 1) for p in procs],
            "cpu_s": [round(sum(p.cpu_times()[:2]), 2) for p in procs]}


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from resilient_train.cluster.ports import free_ports

    timeout = args.timeout
    reference = Group("reference", "train", work, args.steps, free_ports(2))
    try:
        ref = reference.wait("done", timeout)
    finally:
        reference.kill()
    # The training group trains far past --steps, saving every SAVE_EVERY steps, until killed.
    active = Group("active", "train", work, 10**9, free_ports(2))
    try:
        active.wait("progress", timeout, where=lambda r: r["step"] >= 2 * SAVE_EVERY)
        time.sleep(args.measure_s)  # its throughput alone
        standby_started = time.time()
        standby = Group("standby", "standby", work, args.steps, free_ports(2))
        try:
            ready = [standby.wait("traced", timeout, rank=r) for r in range(2)]
            ready_at = max(r["t"] for r in ready)
            usage = _usage([p.pid for p in standby.procs])
            time.sleep(args.measure_s)
            active_records = active.records()
            alone = _steps_per_s(active_records, standby_started - args.measure_s, standby_started)
            forming = _steps_per_s(active_records, standby_started, ready_at)
            beside = _steps_per_s(active_records, ready_at, time.time())
            time.sleep(args.idle_s)  # idle: longer than the coordination service's heartbeat timeout
            saved = [r for r in active.records() if r["event"] == "saved" and r["step"] <= args.steps - SAVE_EVERY]
            # the newest checkpoint not past --steps, so the standby group has steps left to train
            newest = saved[-1]
            active.procs[0].send_signal(signal.SIGKILL)
            killed_at = time.time()
            (work / "standby.go").write_text(newest["path"])
            firsts = [standby.wait("first_step", timeout, rank=r) for r in range(2)]
            restored = standby.wait("restored", timeout)
            done = [standby.wait("done", timeout, rank=r) for r in range(2)]
            alive_after = [p.poll() is None or p.returncode == 0 for p in standby.procs]
        finally:
            standby.kill()
    finally:
        active.kill()
    forms = {"formed": True, "phases_s": {e: max(standby.records(r)[i]["seconds"] for r in range(2))
                                          for i, e in enumerate(("imported", "strategy", "model", "traced"))},
             "start_to_ready_s": round(ready_at - standby_started, 3)}
    idle = {
        "idle_s": args.idle_s, "survived_idle": all(alive_after), "restored_step": restored["step"],
        "checkpoint": newest["path"],
        "traces_after_go": [d["traces_after_go"] for d in done], "digest": done[0]["digest"],
        "digest_matches": done[0]["digest"] == ref["digest"] and done[1]["digest"] == ref["digest"],
        "go_to_first_step_s": round(max(f["t"] for f in firsts) - restored["go_at"], 3),
        "restore_s": restored["seconds"], "kill_to_go_s": round(restored["go_at"] - killed_at, 3),
    }
    cost = {**usage, "throughput_steps_per_s": {"alone": alone, "while_standby_forms": forming,
                                                "beside_idle_standby": beside},
            "throughput_ratio_forming": round(forming / alone, 3) if alone and forming else None,
            "throughput_ratio_idle": round(beside / alone, 3) if alone and beside else None}
    return {"reference": {"digest": ref["digest"], "step": ref["step"]}, "second_group_forms": forms,
            "idle_then_restore": idle, "cost": cost}


def member_killed(args: argparse.Namespace, work: Path, checkpoint: str) -> dict[str, Any]:
    """A standby group loses rank 1 while idle; then rank 0 is told to go (restore ``checkpoint``, train)."""
    from resilient_train.cluster.ports import free_ports

    group = Group("victim", "standby", work, args.steps, free_ports(2))
    try:
        for r in range(2):
            group.wait("traced", args.timeout, rank=r)
        group.procs[1].send_signal(signal.SIGKILL)
        killed = time.time()
        aborted_after = None
        while time.time() - killed < args.watch_s and aborted_after is None:
            if "StartAbort" in group.log_tail(0):  # the coordination service aborted its collectives
                aborted_after = round(time.time() - killed, 2)
            time.sleep(0.1)
        alive_idle = group.procs[0].poll() is None
        (work / "victim.go").write_text(checkpoint)
        try:
            code = group.procs[0].wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            code = None
        tail = group.log_tail(0)
    finally:
        group.kill()
    lines = [line for line in tail.splitlines() if "Error" in line or "heartbeat" in line]
    return {"collectives_aborted_after_s": aborted_after, "rank0_alive_while_idle": alive_idle,
            "rank0_exit_code_after_go": code, "rank0_log_errors": [line[:300] for line in lines[-3:]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=60, help="steps of the reference run and of the takeover")
    parser.add_argument("--idle-s", type=float, default=25.0, help="the standby group's idle time before the kill")
    parser.add_argument("--measure-s", type=float, default=5.0, help="throughput windows of the training group")
    parser.add_argument("--watch-s", type=float, default=40.0, help="how long to watch a standby group missing a member")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "preformed_group.json"))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(json.loads(args.worker))
    check_smoke_out(parser, args, argv)
    if args.smoke:
        args.steps, args.idle_s, args.measure_s, args.watch_s = 30, 1.0, 1.0, 15.0
    uptime_before = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="rt-preformed-") as tmp:
        work = Path(tmp)
        found = run(args, work)
        killed = member_killed(args, work, found["idle_then_restore"]["checkpoint"])
    idle = found["idle_then_restore"]
    report = {
        "benchmark": "preformed_group", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "load_before": [round(x, 2) for x in uptime_before],
                 "load_after": [round(x, 2) for x in os.getloadavg()]},
        "setup": {"workers_per_group": 2, "steps": args.steps, "idle_s": args.idle_s, "save_every": SAVE_EVERY,
                  "model": f"dense {FEATURES}-64-1, SGD momentum, batch {BATCH}", "heartbeat_timeout_s": 10.0},
        **found,
        "standby_member_killed": killed,
        "answers": {
            "second_group_forms_beside_training": found["second_group_forms"]["formed"],
            "idle_past_heartbeat_timeout_ok": idle["survived_idle"],
            "continues_without_retrace": idle["traces_after_go"] == [0, 0],
            "same_digest_as_uninterrupted": idle["digest_matches"],
            "group_usable_after_a_member_is_killed": killed["rank0_exit_code_after_go"] == 0,
        },
        "wall_s": round(time.time() - started, 1), "smoke": args.smoke,
    }
    write_result(args.out, report)
    print(json.dumps({k: report[k] for k in ("answers", "idle_then_restore", "cost", "standby_member_killed")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
