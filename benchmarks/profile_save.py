"""Profile the background half of an async save of recipes/wide_mlp.py.

    .venv/bin/python benchmarks/profile_save.py > benchmarks/results/async_save_profile.txt
    .venv/bin/python benchmarks/profile_save.py --smoke --out /tmp/profile_save.json

One process, no training beside it: snapshot + persist_twin (TF write, weights digest,
CheckpointStore.commit into a local store with a host cache) three times after a warm-up;
prints the cProfile (cumulative) and the mean persist time and peak extra RSS (also
written to ``--out`` as JSON when given).
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import add_smoke_flag, check_smoke_out  # noqa: E402

RESULT_KEYS = ("state_bytes", "persist_s", "persists", "extra_rss_over_state", "smoke")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persists", type=int, default=3, help="profiled persists after the warm-up (default 3)")
    parser.add_argument("--out", help="also write the figures as JSON here")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    check_smoke_out(parser, args, argv)
    if args.smoke:
        args.persists = 1

    import psutil
    import tensorflow as tf

    from resilient_train.checkpoint import CheckpointStore
    from resilient_train.job.recipe import load_recipe, resolve_params
    from resilient_train.runner.state.checkpointing import SaveRequest, TwinState, persist_twin
    from resilient_train.runner.failures.faults import FaultPlan
    from resilient_train.runner.state.model_state import weights_digest

    recipe = load_recipe(str(ROOT / "recipes" / "wide_mlp.py"))
    params = resolve_params(recipe.params, {})

    def build():
        m = recipe.build_model(params)
        o = recipe.build_optimizer(params)
        o.build(m.trainable_variables)
        return m, o

    model, opt = build()
    gs = tf.Variable(0, dtype=tf.int64)
    live = tf.train.Checkpoint(model=model, optimizer=opt, global_step=gs)

    def build_twin():
        m, o = build()
        return tf.train.Checkpoint(model=m, optimizer=o, global_step=tf.Variable(0, dtype=tf.int64)), m

    twin = TwinState.build(live, model, build_twin)
    work = tempfile.mkdtemp()
    store = CheckpointStore(os.path.join(work, "store"), {}, host_cache=os.path.join(work, "cache"))
    faults = FaultPlan([], rank=0, attempt=0)
    proc = psutil.Process()

    def persist(step):
        twin.snapshot()
        return persist_twin(twin, SaveRequest(global_step=step, epoch=0, step_in_epoch=step), store=store,
                            staging_root=os.path.join(work, "staging"), digest=weights_digest, run_id="p",
                            world_size=1, faults=faults, keep=3, emit=lambda *a, **k: None)

    persist(1)  # warm (tracing)
    peak = [proc.memory_info().rss]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    base = proc.memory_info().rss
    threading.Thread(target=sample, daemon=True).start()
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    for step in range(2, 2 + args.persists):
        persist(step)
    prof.disable()
    elapsed = (time.perf_counter() - t) / args.persists
    stop.set()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(28)
    print(out.getvalue())
    figures = {"state_bytes": twin.state_bytes, "persist_s": round(elapsed, 3), "persists": args.persists,
               "extra_rss_over_state": round((peak[0] - base) / twin.state_bytes, 2), "smoke": args.smoke}
    print(json.dumps(figures))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
