"""Profile the background half of an async save of recipes/wide_mlp.py.

    .venv/bin/python benchmarks/profile_save.py > benchmarks/results/async_save_profile.txt

One process, no training beside it: snapshot + persist_twin (TF write, weights digest,
CheckpointStore.commit into a local store with a host cache) three times after a warm-up;
prints the cProfile (cumulative) and the mean persist time and peak extra RSS.
"""
import cProfile, io, os, pstats, shutil, sys, tempfile, time, json, threading
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import psutil, tensorflow as tf
from resilient_train.checkpoint import CheckpointStore
from resilient_train.job.recipe import load_recipe, resolve_params
from resilient_train.runner.checkpointing import TwinState, SaveRequest, persist_twin
from resilient_train.runner.faults import FaultPlan
from resilient_train.runner.model_state import weights_digest

recipe = load_recipe("recipes/wide_mlp.py"); params = resolve_params(recipe.params, {})
def build():
    m = recipe.build_model(params); o = recipe.build_optimizer(params); o.build(m.trainable_variables)
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
peak = [proc.memory_info().rss]; stop = threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss); time.sleep(0.002)
base = proc.memory_info().rss
threading.Thread(target=sample, daemon=True).start()
prof = cProfile.Profile(); t = time.perf_counter(); prof.enable()
for step in (2, 3, 4):
    persist(step)
prof.disable(); elapsed = (time.perf_counter() - t) / 3; stop.set()
out = io.StringIO(); pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(28)
print(out.getvalue())
print(json.dumps({"state_bytes": twin.state_bytes, "persist_s": round(elapsed, 3),
                  "extra_rss_over_state": round((peak[0] - base) / twin.state_bytes, 2)}))
shutil.rmtree(work, ignore_errors=True)
