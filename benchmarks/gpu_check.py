"""Check this project on a GPU host: one command, one JSON, pass/fail per check.

    benchmarks/gpu_check.sh                  # ~5 min on one GPU (estimated) -> benchmarks/results/gpu_check.json
    python benchmarks/gpu_check.py --smoke --out /tmp/gpu_check.json   # the CPU form the suite runs

Why it exists: the GPU paths (device placement, ``--gpus-per-worker``, op determinism on
GPU kernels) are tested here only with fakes, on machines without a GPU. A person with a
GPU runs this once and sends back the JSON. The checks, in order:

* ``doctor``: ``resilient-train doctor --json`` exits 0; the GPUs it sees decide the rest.
* ``gpu_visible``: at least one GPU (required unless ``--smoke``).
* ``kill_resume``: an uninterrupted 2-worker run of recipes/digits_cnn.py, then the same
  job on tests/recipes/slow_digits.py (the same batches bit for bit, each delayed so the
  kill can land mid-run) with ``kill -9`` of the chief after its first commit past
  ``kill_after``; passes when the resumed run completes after exactly one restart with
  the uninterrupted run's ``weights_sha256``. Both workers share GPU 0 on a one-GPU host
  (``TF_FORCE_GPU_ALLOW_GROWTH=true``, else the first process takes all the memory) and
  get one GPU each (``--gpus-per-worker 1``) when there are several.
* ``gpus_per_worker``: a run with ``--gpus-per-worker 1`` (two workers where there are two
  GPUs or more, else one) completes; where ``nvidia-smi`` lists the workers' pids, the GPU
  each worker process ran on is recorded (``worker_gpus``) and must be one GPU per worker.
* ``throughput``: steps/s of the plain MWMS tutorial loop (benchmarks/_plain_mwms.py) and
  of ``resilient-train run`` with the defaults, on the same device (GPU 0 shared by both
  workers), through benchmarks/throughput.py; passes when both ran (the ratio is a figure).

Op determinism is on in the runner; where an op has no deterministic GPU kernel,
TensorFlow fails the step with an error naming the op. Every run's output, worker logs
and error files are searched for such errors: they are listed by op name in
``determinism_errors`` (and the run's check fails) instead of disappearing in a log.
The script exits 0 when every check passed, else 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import add_smoke_flag, check_smoke_out, write_result  # noqa: E402
from resilient_train.rundir.events import read_events  # noqa: E402
from resilient_train.rundir.layout import RunDir  # noqa: E402

RESULT_KEYS = ("benchmark", "date", "smoke", "passed", "gpus", "checks", "determinism_errors", "setup", "wall_s")
DIGITS = "recipes/digits_cnn.py"
SLOW_DIGITS = "tests/recipes/slow_digits.py"  # digits_cnn's values, each batch delayed (step_delay_s)
# (flags, step_delay_s for the killed run, kill after the first commit at or past this step)
SIZES = {
    "smoke": (["--epochs", "2", "--steps-per-epoch", "10", "--global-batch-size", "32", "--save-every-steps", "4"], 0.15, 4),
    "full": (["--epochs", "2", "--steps-per-epoch", "100", "--global-batch-size", "64", "--save-every-steps", "20"], 0.02, 120),
}
THROUGHPUT_STEPS = {"smoke": 120, "full": 1000}
# TensorFlow's messages for an op without a deterministic GPU kernel (tf.errors.UnimplementedError):
# "A deterministic GPU implementation of <Op> is not currently available", "... of <op> not available".
_DETERMINISM = re.compile(r"[Dd]eterministic GPU implementation of ([\w:./-]+(?: [\w-]+)*?) (?:is )?not (?:currently )?available"
                          r"|(\w+) (?:does not|doesn't) have a deterministic GPU implementation"
                          r"|determinism[^\n]{0,120}not (?:currently )?(?:available|supported)[^\n]{0,80}")


def _env() -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT), TF_FORCE_GPU_ALLOW_GROWTH="true")
    env.pop("RT_FAULTS", None)
    return env


def _ts(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["ts"]).timestamp()


def _nvidia_smi_apps() -> dict[int, str] | None:
    """pid -> GPU uuid of every process on a GPU, or None where nvidia-smi does not answer."""
    if shutil.which("nvidia-smi") is None:
        return None
    proc = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=20)
    if proc.returncode:
        return None
    apps = {}
    for line in proc.stdout.strip().splitlines():
        pid, _, uuid = line.partition(",")
        if pid.strip().isdigit():
            apps[int(pid)] = uuid.strip()
    return apps


def determinism_errors(text: str) -> list[dict[str, str | None]]:
    """The determinism errors in ``text``: the op's name where TensorFlow gives one, and the line."""
    found: dict[str, dict[str, str | None]] = {}
    for line in text.splitlines():
        match = _DETERMINISM.search(line)
        if match:
            op = match.group(1) or match.group(2)
            found.setdefault(op or line.strip()[:200], {"op": op, "message": line.strip()[:300]})
    return list(found.values())


class Run:
    """One ``resilient-train run`` in a subprocess, watched through its events.jsonl."""

    def __init__(self, recipe: str, run_dir: Path, flags: list[str]) -> None:
        self.recipe, self.run_dir, self.flags = recipe, run_dir, flags
        self.output = ""
        self.returncode: int | None = None
        self.worker_gpus: dict[int, set[str]] = {}  # pid -> GPU uuids nvidia-smi saw it on

    def go(self, timeout: float, when: Callable[[list[dict[str, Any]]], bool] | None = None,
           action: Callable[[list[dict[str, Any]]], None] | None = None) -> "Run":
        command = [sys.executable, "-m", "resilient_train", "run", self.recipe, "--run-dir", str(self.run_dir), *self.flags]
        log = self.run_dir.parent / f"{self.run_dir.name}.out"
        self.run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            proc = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT)
            deadline, fired, next_smi = time.monotonic() + timeout, False, 0.0
            try:
                while proc.poll() is None:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{self.recipe} in {self.run_dir} did not finish in {timeout} s")
                    if when is not None and not fired and when(self.events):
                        action(self.events)
                        fired = True
                    if time.monotonic() >= next_smi:
                        for pid, uuid in (_nvidia_smi_apps() or {}).items():
                            self.worker_gpus.setdefault(pid, set()).add(uuid)
                        next_smi = time.monotonic() + 1.0
                    time.sleep(0.05)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        self.returncode = proc.returncode
        self.output = log.read_text(errors="replace")
        if when is not None and not fired:
            raise RuntimeError(f"the kill never fired: the run ended first ({self.run_dir})")
        return self

    @property
    def events(self) -> list[dict[str, Any]]:
        path = RunDir(self.run_dir).events
        return read_events(path) if path.exists() else []

    @property
    def summary(self) -> dict[str, Any]:
        path = RunDir(self.run_dir).summary
        return json.loads(path.read_text()) if path.exists() else {}

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def text(self) -> str:
        """The job's output, every worker log and every error file: where a TF error shows up."""
        parts = [self.output]
        for attempt in RunDir(self.run_dir).attempts():
            parts += [p.read_text(errors="replace") for p in sorted(attempt.path.glob("worker-*.log"))]
            parts += [p.read_text(errors="replace") for p in attempt.errors()]
        return "\n".join(parts)

    def digest(self) -> str | None:
        return self.summary.get("weights_sha256")


def check_doctor(work: Path) -> tuple[dict[str, Any], int]:
    proc = subprocess.run([sys.executable, "-m", "resilient_train", "doctor", "--json"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stdout)
    findings = {c["check"]: c for c in report["checks"]}
    devices = findings.get("devices", {}).get("data", {}).get("devices", [])
    gpus = sum(1 for kind, _ in devices if kind == "GPU")
    return {"passed": proc.returncode == 0 and report["ok"], "exit_code": proc.returncode, "ok": report["ok"],
            "not_ok": {name: {"status": c["status"], "detail": c["detail"], "fix": c["fix"]}
                       for name, c in findings.items() if c["status"] != "ok"},
            "devices": [name for _, name in devices],
            "tf_build": findings.get("tf_build", {}).get("detail")}, gpus


def check_kill_resume(work: Path, size: str, gpus: int, timeout: float) -> tuple[dict[str, Any], list]:
    flags, delay, kill_after = SIZES[size]
    flags = [*flags, "--max-restarts", "1"] + (["--gpus-per-worker", "1"] if gpus >= 2 else [])
    reference = Run(DIGITS, work / "reference", [*flags, "--workers", "2"]).go(timeout)
    killed_at: list[float] = []

    def committed(events: list[dict[str, Any]]) -> bool:
        return any(e["event"] == "checkpoint_committed" and e.get("attempt") == 1 and e["global_step"] >= kill_after
                   for e in events)

    def kill_chief(events: list[dict[str, Any]]) -> None:
        chief = next(e["pid"] for e in events if e["event"] == "worker_started" and e["attempt"] == 1 and e["rank"] == 0)
        killed_at.append(time.time())
        os.kill(chief, signal.SIGKILL)

    resumed = Run(SLOW_DIGITS, work / "killed", [*flags, "--workers", "2", "--set", f"step_delay_s={delay}"])
    resumed.go(timeout, when=committed, action=kill_chief)
    summary = resumed.summary
    restored = resumed.named("restored")
    first_after = [e for e in resumed.named("first_step") if e.get("attempt") == 2]
    result = {
        "reference_exit_code": reference.returncode,
        "reference_sha256": reference.digest(),
        "resumed_exit_code": resumed.returncode,
        "resumed_sha256": resumed.digest(),
        "status": summary.get("status"),
        "global_step": summary.get("global_step"),
        "restarts": summary.get("restarts"),
        "lost_steps": summary.get("lost_steps"),
        "killed_after_commit_at_or_past": kill_after,
        "restored_step": restored[0]["global_step"] if restored else None,
        "kill_to_first_step_s": round(_ts(first_after[0]) - killed_at[0], 3) if first_after and killed_at else None,
        "gpus_per_worker": 1 if gpus >= 2 else 0,
    }
    result["passed"] = (reference.returncode == 0 and resumed.returncode == 0 and result["restarts"] == 1
                        and result["reference_sha256"] is not None
                        and result["resumed_sha256"] == result["reference_sha256"])
    return result, [*determinism_errors(reference.text()), *determinism_errors(resumed.text())]


def check_gpus_per_worker(work: Path, size: str, gpus: int, timeout: float) -> tuple[dict[str, Any], list]:
    flags, _, _ = SIZES[size]
    workers = 2 if gpus >= 2 else 1  # one GPU each; with no GPU (smoke) the slices are empty and it runs on CPU
    run = Run(DIGITS, work / "gpus-per-worker", [*flags, "--workers", str(workers), "--gpus-per-worker", "1"]).go(timeout)
    pids = {e["rank"]: e["pid"] for e in run.named("worker_started")}
    # nvidia-smi in a container may list host pids, none of them ours: then nothing is known.
    seen = any(run.worker_gpus.get(pid) for pid in pids.values())
    worker_gpus = {rank: sorted(run.worker_gpus.get(pid, ())) for rank, pid in pids.items()} if seen else None
    one_each = worker_gpus is None or (all(len(g) == 1 for g in worker_gpus.values())
                                       and len({g[0] for g in worker_gpus.values()}) == len(worker_gpus))
    result = {"workers": workers, "gpus_per_worker": 1, "exit_code": run.returncode,
              "status": run.summary.get("status"), "global_step": run.summary.get("global_step"),
              "standby_disabled": bool(run.named("standby_disabled")),
              "worker_gpus": worker_gpus, "passed": run.returncode == 0 and one_each}
    return result, determinism_errors(run.text())


def check_throughput(size: str, gpus: int) -> dict[str, Any]:
    from benchmarks import throughput

    recipe = {**throughput.RECIPES["digits_cnn"], "steps": THROUGHPUT_STEPS[size],
              **({"progress_every_s": 0.0} if size == "smoke" else {})}
    configs = throughput.configurations(["auto"])
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpus:  # the same device for both: GPU 0, shared by the two workers
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    try:
        runs = {name: throughput.measure(name, configs[name], recipe) for name in ("plain", "ours_nosave_auto")}
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    plain, ours = runs["plain"]["steps_per_s"], runs["ours_nosave_auto"]["steps_per_s"]
    return {"recipe": recipe, "device": "GPU 0, shared by both workers" if gpus else "CPU",
            "plain_steps_per_s": plain, "ours_steps_per_s": ours,
            "ratio_to_plain": round(ours / plain, 3) if plain else None, "runs": runs,
            "passed": bool(plain and ours)}


def _attempt(checks: dict[str, Any], name: str, run: Callable[[], dict[str, Any]]) -> None:
    """Run one check; an exception fails that check (recorded with its message), not the script."""
    started = time.time()
    try:
        checks[name] = run()
    except Exception as exc:  # the finding is the failure itself: record it and go on
        checks[name] = {"passed": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    checks[name]["wall_s"] = round(time.time() - started, 1)
    print(name, json.dumps(checks[name]), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run (default 600)")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    size = "smoke" if args.smoke else "full"
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="rt-gpu-check-"))
    checks: dict[str, Any] = {}
    errors: list[dict[str, str | None]] = []
    gpus = 0

    def doctor() -> dict[str, Any]:
        nonlocal gpus
        result, gpus = check_doctor(work)
        return result

    def with_errors(check: Callable[[], tuple[dict[str, Any], list]]) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            result, found = check()
            errors.extend(found)
            result["determinism_errors"] = [e["op"] or e["message"] for e in found]
            result["passed"] = result["passed"] and not found
            return result
        return run

    try:
        _attempt(checks, "doctor", doctor)
        checks["gpu_visible"] = {"passed": gpus > 0 or args.smoke, "gpus": gpus, "required": not args.smoke}
        _attempt(checks, "kill_resume", with_errors(lambda: check_kill_resume(work, size, gpus, args.timeout)))
        _attempt(checks, "gpus_per_worker", with_errors(lambda: check_gpus_per_worker(work, size, gpus, args.timeout)))
        _attempt(checks, "throughput", lambda: check_throughput(size, gpus))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "benchmark": "gpu_check",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "smoke": args.smoke,
        "passed": all(c["passed"] for c in checks.values()),
        "gpus": gpus,
        "checks": checks,
        "determinism_errors": errors,
        "setup": {"size": size, "flags": SIZES[size][0], "throughput_steps": THROUGHPUT_STEPS[size],
                  "env": {"TF_FORCE_GPU_ALLOW_GROWTH": "true"},
                  "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
                  "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "wall_s": round(time.time() - started, 1),
    }
    write_result(args.out, report)
    print(json.dumps({name: c["passed"] for name, c in checks.items()}), "->", "PASS" if report["passed"] else "FAIL")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
