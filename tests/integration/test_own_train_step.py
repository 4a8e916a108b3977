"""A model with its own train_step (issue 46 item 5): keras.io's VAE runs unchanged and resumes exactly.

examples/keras_vae.py is keras.io's "Variational AutoEncoder" on scikit-learn's digits: a
``VAE(keras.Model)`` subclass whose ``train_step`` computes its own loss, applies its gradients
with ``self.optimizer.apply_gradients`` and reports three ``keras.metrics.Mean`` trackers, with
a seeded sampling layer; 4 epochs of 14 steps at a global batch of 64.

* One worker against plain Keras ``model.fit`` of the same script (tests/recipes/plain_keras.py:
  the default strategy): the trained weights are bit-identical (the same weights_sha256), and
  so are the epoch's ``reconstruction_loss`` and ``kl_loss``; ``loss`` (the total tracker) equals
  Keras' to float32 rounding, relative 1e-6 (measured: equal or one ulp apart; the runner's call
  is another graph, whose optimizer may add the tracker's terms in another order).
* The chief's export at completion: the VAE has no ``get_config`` (and no ``call``), so it is
  exported as ``model.weights.h5``, with ``skipped`` saying what model.keras needs.
* (slow) Two workers, the memory tier as a user gets it (every worker keeps a twin: the trackers are
  sync-on-read variables, and the subclass is copied from the arguments it was made with), the
  chief killed with -9 right after the commit of step 20 (mid-epoch 1): the run ends with the
  uninterrupted run's weights digest, and every epoch's reconstruction_loss and kl_loss, the
  resumed epoch 1's included, equal the uninterrupted run's exactly (a checkpoint holds a
  tracker's sum over replicas and a restore gives each replica half; every step leaves each
  replica that half too: runner/keras_recipes/own_step.py ``OwnStep.fold``); ``loss``, the total
  tracker, to float32 rounding: it differs by one ulp between two uninterrupted 2-worker runs too
  (cause open).
* A model with its own ``train_step`` and ``test_step`` (tests/recipes/fit_own_test_step.py,
  keras.io's "providing your own evaluation step"), validated in ``fit`` and evaluated after it,
  on one worker: the trained weights are plain Keras' bit for bit, and every epoch's ``loss``,
  ``mae``, ``val_loss`` and ``val_mae`` and ``evaluate()``'s dict equal Keras' to float32
  rounding, relative 1e-6 (the runner's call is another graph).
* keras.io's own ``vae.fit(mnist_digits, epochs=30, batch_size=128)``: x alone, no y (the example
  with its fit line so, on 1792 digits, ``shuffle=False``: the runner's permutation is its own and
  it drops a last partial batch), on one worker: the epochs' logs equal Keras' to relative 1e-6
  (measured: bit for bit) and every weight to float32 rounding (``allclose``, rtol 1e-5): not
  bit-identical, unlike the same digits fed as a dataset; the last bits of the weights differ
  (seen, cause not found: the batches and the logs are the same).
* keras.io's GAN (tests/recipes/fit_gan.py: compile() overridden to take two optimizers, a
  seeded latent sampler) on 2 workers, the chief killed with -9 after the commit of step 15
  (mid-epoch 1): it ends with the uninterrupted run's digest and its d_loss/g_loss logs to float32
  rounding (both optimizers are built before the restore and restored with the model:
  runner/keras_recipes/own_step.py), and ``verify --deep --all`` restores every kept checkpoint
  into the script's model with nothing missing or unexpected. ``resilient-train export`` of the
  uninterrupted run's newest and oldest kept checkpoints writes the GAN's weights
  (``model.weights.h5``: no get_config, no call) with each commit's digest, and they load into
  the script's GAN with it. (slow) A SIGTERM inside epoch 1 saves at an agreed step, exits 143,
  and the re-run ends with that digest and the same d_loss/g_loss logs.
* (slow) keras.io's ``vae.fit(x, batch_size=128)`` on 2 workers with a CSVLogger: a kill -9 of the
  chief mid-epoch, and a SIGTERM and re-run, each end with the uninterrupted run's digest and its
  CSV log byte for byte but for the total tracker's ``loss``, to float32 rounding (not
  reproducible between two uninterrupted runs either: ``assert_csv_but_loss``).
* (slow) tests/recipes/fit_own_test_step.py with a CSVLogger on 2 workers: a kill -9 of the chief
  mid-epoch, and a SIGTERM and re-run, each end with the uninterrupted run's digest and its CSV
  log byte for byte.
* (slow) A SIGTERM inside epoch 2 of the same script slowed by a batch-end sleep (a callback:
  the arithmetic is the same) saves, exits 143, and the re-run ends with that digest too.
"""

from __future__ import annotations

import csv
import io
import json
import math
import signal
import subprocess
import sys

import numpy as np
import pytest

from resilient_train.errors import EXIT_PREEMPTED
from tests.integration.harness import REPO, environment, run_job, run_job_until

SCRIPT = str(REPO / "examples/keras_vae.py")
STEPS_PER_EPOCH, EPOCHS = 14, 4
REL = 1e-6  # float32 rounding of the total tracker (see the module docstring)


def without_loss(logs):
    return {k: v for k, v in logs.items() if k != "loss"}


def epoch_logs(job):
    return [{"loss": e["loss"], **e["metrics"]} for e in job.named("epoch_finished")]


def close(a, b):
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=REL) for k in a)


@pytest.fixture(scope="module")
def plain_keras(tmp_path_factory):
    out = tmp_path_factory.mktemp("vae_plain")
    proc = subprocess.run([sys.executable, str(REPO / "tests/recipes/plain_keras.py"), SCRIPT, str(out / "fit.json")],
                          cwd=out, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout
    return json.loads((out / "fit.json").read_text())


def test_one_worker_trains_as_plain_keras_fit(tmp_path, plain_keras):
    job = run_job(SCRIPT, tmp_path / "run", "--workers", "1", "--no-warm-standby", cwd=tmp_path)
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == STEPS_PER_EPOCH * EPOCHS
    assert job.summary["weights_sha256"] == plain_keras["weights_sha256"]
    history, logs = plain_keras["history"], epoch_logs(job)
    assert [e["reconstruction_loss"] for e in logs] == history["reconstruction_loss"]
    assert [e["kl_loss"] for e in logs] == history["kl_loss"]
    assert all(math.isclose(a, b, rel_tol=REL) for a, b in zip([e["loss"] for e in logs], history["loss"], strict=True))
    # No get_config and no call(): the chief exports the weights, and says what model.keras needs.
    [exported] = job.named("model_exported")
    assert exported["files"] == {"weights": "model.weights.h5"}
    assert exported["skipped"]["keras"].startswith("VAE has no get_config(): add get_config() to VAE")
    assert sorted(exported["skipped"]) == ["keras", "saved_model"]


def test_own_test_step_validates_and_evaluates_as_plain_keras_on_one_worker(tmp_path):
    script = str(REPO / "tests/recipes/fit_own_test_step.py")
    (tmp_path / "plain").mkdir()
    proc = subprocess.run([sys.executable, str(REPO / "tests/recipes/plain_keras.py"), script, str(tmp_path / "fit.json")],
                          cwd=tmp_path, env=environment(FIT_SCRIPT_OUT=str(tmp_path / "plain")), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout
    plain = json.loads((tmp_path / "fit.json").read_text())
    job = run_job(script, tmp_path / "run", "--workers", "1", "--no-warm-standby", cwd=tmp_path,
                  env={"FIT_SCRIPT_OUT": str(tmp_path)})
    assert job.returncode == 0, job.output
    assert job.summary["weights_sha256"] == plain["weights_sha256"]
    epochs = job.named("epoch_finished")
    ours = {"loss": [e["loss"] for e in epochs], "mae": [e["metrics"]["mae"] for e in epochs],
            "val_loss": [e["val_loss"] for e in epochs], "val_mae": [e["val_metrics"]["mae"] for e in epochs]}
    assert ours.keys() == plain["history"].keys()
    for key, values in ours.items():
        assert all(math.isclose(a, b, rel_tol=REL) for a, b in zip(values, plain["history"][key], strict=True)), key
    assert [e["val_examples"] for e in epochs] == [90] * 3
    assert close(json.loads((tmp_path / "evaluate.json").read_text()),
                 json.loads((tmp_path / "plain" / "evaluate.json").read_text()))


@pytest.mark.slow  # the same own-step path as test_one_worker_trains_as_plain_keras_fit, fed x only
def test_fit_x_without_y_trains_as_plain_keras_on_one_worker(tmp_path):
    source = (REPO / "examples/keras_vae.py").read_text()
    fit = "vae.fit(dataset, epochs=4, steps_per_epoch=14)"
    assert fit in source
    script = tmp_path / "keras_vae_x.py"
    script.write_text(source.replace(fit, "vae.fit(digits[:1792], epochs=2, batch_size=128, shuffle=False)") +
                      "import os\nnp.savez(os.environ['FIT_SCRIPT_OUT'] + '/weights.npz', *vae.get_weights())\n")
    for name in ("plain", "ours"):
        (tmp_path / name).mkdir()
    proc = subprocess.run([sys.executable, str(REPO / "tests/recipes/plain_keras.py"), str(script),
                           str(tmp_path / "fit.json")], cwd=tmp_path, env=environment(FIT_SCRIPT_OUT=str(tmp_path / "plain")),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout
    plain = json.loads((tmp_path / "fit.json").read_text())
    job = run_job(str(script), tmp_path / "run", "--workers", "1", "--no-warm-standby", cwd=tmp_path,
                  env={"FIT_SCRIPT_OUT": str(tmp_path / "ours")})
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == 2 * 14
    logs = epoch_logs(job)
    for key, values in plain["history"].items():
        assert all(math.isclose(e[key], b, rel_tol=REL) for e, b in zip(logs, values, strict=True)), key
    # Not bit for bit (see the module docstring): every weight to float32 rounding.
    theirs, ours = (np.load(tmp_path / name / "weights.npz") for name in ("plain", "ours"))
    assert len(ours.files) == len(theirs.files) == 14
    assert all(np.allclose(ours[k], theirs[k], rtol=1e-5, atol=1e-7) for k in theirs.files)


GAN_SCRIPT = REPO / "tests/recipes/fit_gan.py"
GAN_FIT = "gan.fit(dataset, epochs=2, steps_per_epoch=10)"
GAN_FLAGS = ("--save-every-steps", "5")


def gan_metrics(job):
    return [e["metrics"] for e in job.named("epoch_finished")]


@pytest.fixture(scope="module")
def gan_reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("gan_reference")
    job = run_job(str(GAN_SCRIPT), root / "run", *GAN_FLAGS, cwd=root, tier_default=True)
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == 2 * 10
    return job


def test_a_gan_with_two_optimizers_kill_chief_mid_epoch_ends_with_the_uninterrupted_digest(tmp_path, gan_reference):
    killed = run_job(str(GAN_SCRIPT), tmp_path / "run", *GAN_FLAGS, cwd=tmp_path, tier_default=True,
                     faults=[{"point": "after_commit", "global_step": 15, "rank": 0}])
    assert killed.returncode == 0, killed.output
    assert killed.summary["restarts"] == 1
    [restored] = killed.named("restored")
    assert restored["global_step"] == 15  # mid-epoch 1 (10 steps an epoch)
    assert killed.summary["weights_sha256"] == gan_reference.summary["weights_sha256"]
    # d_loss and g_loss, the trackers' results (no "loss" log); epoch 1 resumed mid-way: every
    # step leaves the trackers in the state a restore gives (own_step.py OwnStep.fold). Compared
    # to float32 rounding, not bit for bit: the VAE's total tracker differs by one ulp between two
    # uninterrupted 2-worker runs (cause open, module docstring), and a tracker updated after an
    # optimizer's apply, as these are, may too; the digest above is exact.
    assert [sorted(m) for m in gan_metrics(killed)] == [["d_loss", "g_loss"]] * 2
    assert all(close(a, b) for a, b in zip(gan_metrics(killed), gan_metrics(gan_reference), strict=True))
    # verify --deep rebuilds the script's model (its two optimizers from its fit input, its
    # trackers) and restores every kept checkpoint into it: nothing missing or unexpected.
    deep_check_all(killed, tmp_path)


def deep_check_all(job, cwd):
    """``verify --deep --all`` of ``job``'s checkpoints: each consistent, with the committed digest."""
    checked = subprocess.run([sys.executable, "-m", "resilient_train", "verify", str(job.run_dir / "checkpoints"),
                              "--deep", "--all", "--json"], cwd=cwd, env=environment(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, timeout=180)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    deep = json.loads(checked.stdout)["deep"]
    committed = {e["global_step"]: e["weights_sha256"] for e in job.named("checkpoint_committed")}
    assert deep["checkpoints"] and all(c["consistent"] and c["unexpected"] == [] and c["missing"] == []
                                       for c in deep["checkpoints"])
    assert all(c["weights_sha256"]["restored"] == committed[c["global_step"]] for c in deep["checkpoints"])


def test_export_of_a_gans_checkpoints_writes_its_weights_with_each_commits_digest(tmp_path, gan_reference):
    # resilient-train export of the GAN run's newest and oldest kept checkpoints (no run of its
    # own: the reference's): the script is run up to fit() (its two optimizers built from fit's
    # input), each checkpoint's weights restored and checked against its manifest's digest. The
    # GAN has no get_config() and no call(): its weights go to model.weights.h5, as the chief's
    # own export at completion wrote them, and they load into the script's GAN with that digest.
    from resilient_train.checkpoint import CheckpointStore
    from resilient_train.runner.outputs.model_export import exported_weights_sha256

    checkpoints = gan_reference.run_dir / "checkpoints"
    committed = {info.global_step: info.manifest.weights_sha256 for info in CheckpointStore(str(checkpoints)).list()}
    assert max(committed) == 20 and min(committed) < 20
    for step in (None, min(committed)):
        out = tmp_path / f"step{step or 20}"
        proc = subprocess.run([sys.executable, "-m", "resilient_train", "export", str(checkpoints), "--recipe",
                               str(GAN_SCRIPT), "--out", str(out), *(["--step", str(step)] if step else [])],
                              cwd=tmp_path, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        record = json.loads((out / "export.json").read_text())
        assert (record["global_step"], record["weights_sha256"]) == (step or 20, committed[step or 20])
        assert record["files"] == {"weights": "model.weights.h5"}
        assert record["skipped"]["keras"].startswith("GAN has no get_config(): add get_config() to GAN")
        assert sorted(record["skipped"]) == ["keras", "saved_model"]
    [exported] = gan_reference.named("model_exported")
    assert (exported["files"], exported["weights_sha256"]) == ({"weights": "model.weights.h5"}, committed[20])
    # What export.json says to do: rebuild GAN(...) in code (the script's lines before fit(), the
    # default strategy), set built = True (it is never called) and load_weights: the commit's digest.
    assert record["skipped"]["keras"].endswith("rebuild GAN(...) in code and set its built = True (it is never "
                                               "called) and call load_weights('model.weights.h5')")
    source = GAN_SCRIPT.read_text().split(GAN_FIT)[0]
    namespace = {"__name__": "rebuilt_gan"}
    exec(compile(source.replace("tf.distribute.MultiWorkerMirroredStrategy()", "tf.distribute.get_strategy()"),
                 str(GAN_SCRIPT), "exec"), namespace)
    gan = namespace["gan"]
    gan.built = True
    gan.load_weights(tmp_path / f"step{min(committed)}" / "model.weights.h5")
    assert exported_weights_sha256(gan, tmp_path / f"step{min(committed)}") == committed[min(committed)]


@pytest.mark.slow
def test_a_gan_sigterm_saves_exits_143_and_the_rerun_ends_with_the_uninterrupted_digest(tmp_path, gan_reference):
    # The default kill test above covers the restore of both optimizers mid-epoch; this one the
    # agreed save of a SIGTERM inside epoch 1 (a batch-end sleep: the arithmetic is the same).
    source = GAN_SCRIPT.read_text()
    assert GAN_FIT in source
    script = tmp_path / "fit_gan_slowed.py"
    script.write_text("import time\n" + source.replace(GAN_FIT, GAN_FIT[:-1] + ", callbacks=[keras.callbacks."
                                                       "LambdaCallback(on_train_batch_end=lambda b, l: time.sleep(0.3))])"))
    flags = (*GAN_FLAGS, "--steps-per-execution", "1")
    epoch_0_done = lambda events: any(e["event"] == "epoch_finished" and e["epoch"] == 0 for e in events)  # noqa: E731
    preempted = run_job_until(str(script), tmp_path / "run", *flags, when=epoch_0_done, cwd=tmp_path,
                              tier_default=True, action=lambda proc, events: proc.send_signal(signal.SIGTERM))
    assert preempted.returncode == EXIT_PREEMPTED, preempted.output
    [stop] = preempted.named("preempted")
    assert 10 <= stop["global_step"] < 20
    rerun = run_job(str(script), tmp_path / "run", *flags, cwd=tmp_path, tier_default=True)
    assert rerun.returncode == 0, rerun.output
    assert [r["global_step"] for r in rerun.named("restored")] == [stop["global_step"]]
    assert rerun.summary["lost_steps"] == 0
    assert rerun.summary["weights_sha256"] == gan_reference.summary["weights_sha256"]
    assert gan_metrics(rerun) == gan_metrics(gan_reference)


@pytest.mark.slow  # the same own optimizers (own_step.build_own_optimizers) resume exactly in the script GAN's kill test; the recipe's layout: tests/commands/test_verify_deep.py
def test_a_recipes_gan_builds_its_optimizers_from_the_recipes_batch_spec_and_resumes_exactly(tmp_path):
    # The same GAN as a recipe (build_model returns it compiled with two optimizers of its own):
    # they are built before the restore from the spec of the recipe's dataset (loop.py), so a
    # kill after the commit of step 15 resumes their state. One worker: the 2-worker restore of
    # such optimizers is the fit script's test above; what is new here is where the spec comes from.
    recipe = "tests/recipes/gan_recipe.py"
    flags = ("--workers", "1")
    reference = run_job(recipe, tmp_path / "ref", *flags)
    assert reference.returncode == 0, reference.output
    killed = run_job(recipe, tmp_path / "run", *flags, faults=[{"point": "after_commit", "global_step": 15, "rank": 0}])
    assert killed.returncode == 0, killed.output
    assert [e["global_step"] for e in killed.named("restored")] == [15]
    assert killed.summary["weights_sha256"] == reference.summary["weights_sha256"]
    import tensorflow as tf

    newest = sorted((tmp_path / "run" / "checkpoints").glob("ckpt-*/ckpt.index"))[-1]
    keys = tf.train.load_checkpoint(str(newest.with_suffix(""))).get_variable_to_shape_map()
    own = sorted({k.split("/")[1] for k in keys if k.startswith("model/") and k.split("/")[1].endswith("_optimizer")})
    assert own == ["d_optimizer", "g_optimizer"]
    deep_check_all(killed, tmp_path)  # the recipe's optimizers built from its dataset's spec (commands/export.py)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("vae_reference")
    job = run_job(SCRIPT, root / "run", "--save-every-steps", "10", cwd=root, tier_default=True)
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == STEPS_PER_EPOCH * EPOCHS
    return job


@pytest.mark.slow
def test_kill_chief_mid_epoch_ends_with_the_uninterrupted_digest_and_logs(tmp_path, reference):
    # The default test_a_gan_with_two_optimizers_kill_chief_mid_epoch_... covers the same path (an own
    # train_step's trackers and seed generator restored mid-epoch on 2 workers, the memory tier's twin).
    killed = run_job(SCRIPT, tmp_path / "run", "--save-every-steps", "10", cwd=tmp_path, tier_default=True,
                     faults=[{"point": "after_commit", "global_step": 20, "rank": 0}])
    assert killed.returncode == 0, killed.output
    assert killed.summary["restarts"] == 1
    [restored] = killed.named("restored")
    assert restored["global_step"] >= 20 and restored["global_step"] % STEPS_PER_EPOCH != 0  # mid-epoch
    assert killed.summary["weights_sha256"] == reference.summary["weights_sha256"]
    # Epoch 1 was resumed mid-way: its logs hold the restored trackers' first steps. Exactly for
    # reconstruction_loss and kl_loss; "loss" (the total tracker) to float32 rounding, as it is
    # not reproducible on two workers even uninterrupted (assert_csv_but_loss below).
    assert [e["epoch"] for e in killed.named("epoch_finished")] == [0, 1, 2, 3]
    assert [without_loss(e) for e in epoch_logs(killed)] == [without_loss(e) for e in epoch_logs(reference)]
    assert all(close(a, b) for a, b in zip(epoch_logs(killed), epoch_logs(reference), strict=True))


@pytest.mark.slow
def test_sigterm_saves_exits_143_and_the_rerun_ends_with_the_uninterrupted_digest(tmp_path, reference):
    source = (REPO / "examples/keras_vae.py").read_text()
    fit = "vae.fit(dataset, epochs=4, steps_per_epoch=14)"
    assert fit in source
    slowed = tmp_path / "keras_vae_slowed.py"
    slowed.write_text("import time\n" + source.replace(fit, fit[:-1] + ", callbacks=[keras.callbacks.LambdaCallback("
                                                        "on_train_batch_end=lambda batch, logs: time.sleep(0.15))])"))
    flags = ("--save-every-steps", "10", "--steps-per-execution", "1")
    epoch_1_done = lambda events: any(e["event"] == "epoch_finished" and e["epoch"] == 1 for e in events)  # noqa: E731
    preempted = run_job_until(str(slowed), tmp_path / "run", *flags, when=epoch_1_done, cwd=tmp_path,
                              tier_default=True, action=lambda proc, events: proc.send_signal(signal.SIGTERM))
    assert preempted.returncode == EXIT_PREEMPTED, preempted.output
    [stop] = preempted.named("preempted")
    assert 2 * STEPS_PER_EPOCH <= stop["global_step"] < 4 * STEPS_PER_EPOCH
    rerun = run_job(str(slowed), tmp_path / "run", *flags, cwd=tmp_path, tier_default=True)
    assert rerun.returncode == 0, rerun.output
    assert [r["global_step"] for r in rerun.named("restored")] == [stop["global_step"]]
    assert rerun.summary["lost_steps"] == 0
    assert rerun.summary["weights_sha256"] == reference.summary["weights_sha256"]


# A model's own train_step AND test_step on 2 workers (tests/recipes/fit_own_test_step.py, a
# CSVLogger added): the uninterrupted run, shared by the kill and the (slow) SIGTERM case.
OWN_TEST_STEP_FIT = "model.fit(train, epochs=3, steps_per_epoch=11, validation_data=val)"
OWN_TEST_STEP_FLAGS = ("--save-every-steps", "5")


def own_test_step_script(directory, *, sleep=0.0):
    source = (REPO / "tests/recipes/fit_own_test_step.py").read_text()
    assert OWN_TEST_STEP_FIT in source
    callbacks = 'keras.callbacks.CSVLogger("training_log.csv")'
    if sleep:  # a batch-end sleep: the arithmetic is the same, a signal lands inside an epoch
        callbacks += f", keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, l: __import__('time').sleep({sleep}))"
    script = directory / "fit_own_test_step_csv.py"
    script.write_text(source.replace(OWN_TEST_STEP_FIT, OWN_TEST_STEP_FIT[:-1] + f", callbacks=[{callbacks}])"))
    return str(script)


@pytest.fixture(scope="module")
def own_test_step_reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("own_test_step_reference")
    job = run_job(own_test_step_script(root), root / "run", *OWN_TEST_STEP_FLAGS, cwd=root, tier_default=True)
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == 3 * 11
    return job, (root / "training_log.csv").read_bytes()


@pytest.mark.slow
def test_own_train_and_test_step_kill_chief_mid_epoch_ends_with_the_uninterrupted_digest_and_csv(
        tmp_path, own_test_step_reference):
    # The default test_a_gan_with_two_optimizers_kill_chief_mid_epoch_... covers the restore of an own
    # train_step mid-epoch on 2 workers; this one adds the test_step's val_ logs and the CSV log.
    reference, csv = own_test_step_reference
    killed = run_job(own_test_step_script(tmp_path), tmp_path / "run", *OWN_TEST_STEP_FLAGS, cwd=tmp_path,
                     tier_default=True, faults=[{"point": "after_commit", "global_step": 15, "rank": 0}])
    assert killed.returncode == 0, killed.output
    assert killed.summary["restarts"] == 1
    [restored] = killed.named("restored")
    assert restored["global_step"] >= 15 and restored["global_step"] % 11 != 0  # mid-epoch
    assert killed.summary["weights_sha256"] == reference.summary["weights_sha256"]
    assert (tmp_path / "training_log.csv").read_bytes() == csv


@pytest.mark.slow
def test_own_train_and_test_step_sigterm_saves_and_the_rerun_ends_with_the_uninterrupted_digest_and_csv(
        tmp_path, own_test_step_reference):
    # The default test_a_gan_with_two_optimizers_kill_chief_mid_epoch_... covers the same restore path.
    reference, csv = own_test_step_reference
    script = own_test_step_script(tmp_path, sleep=0.15)
    flags = (*OWN_TEST_STEP_FLAGS, "--steps-per-execution", "1")
    epoch_0_done = lambda events: any(e["event"] == "epoch_finished" and e["epoch"] == 0 for e in events)  # noqa: E731
    preempted = run_job_until(script, tmp_path / "run", *flags, when=epoch_0_done, cwd=tmp_path, tier_default=True,
                              action=lambda proc, events: proc.send_signal(signal.SIGTERM))
    assert preempted.returncode == EXIT_PREEMPTED, preempted.output
    [stop] = preempted.named("preempted")
    assert 11 <= stop["global_step"] < 3 * 11
    rerun = run_job(script, tmp_path / "run", *flags, cwd=tmp_path, tier_default=True)
    assert rerun.returncode == 0, rerun.output
    assert [r["global_step"] for r in rerun.named("restored")] == [stop["global_step"]]
    assert rerun.summary["lost_steps"] == 0
    assert rerun.summary["weights_sha256"] == reference.summary["weights_sha256"]
    assert (tmp_path / "training_log.csv").read_bytes() == csv


# keras.io's vae.fit(x, epochs=..., batch_size=...) on 2 workers, with a CSVLogger: the
# uninterrupted run, shared by the (slow) kill and SIGTERM cases.
FIT_X = ("vae.fit(digits[:1792], epochs=2, batch_size=128, shuffle=True, "
         "callbacks=[keras.callbacks.CSVLogger('training_log.csv'){extra}])")
FIT_X_FLAGS = ("--save-every-steps", "10")


def fit_x_script(directory, *, sleep=0.0):
    source = (REPO / "examples/keras_vae.py").read_text()
    fit = "vae.fit(dataset, epochs=4, steps_per_epoch=14)"
    assert fit in source
    # a batch-end sleep: the arithmetic is the same, a signal lands inside an epoch
    extra = f", keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, l: __import__('time').sleep({sleep}))"
    script = directory / "keras_vae_x.py"
    script.write_text(source.replace(fit, FIT_X.format(extra=extra if sleep else "")))
    return str(script)


@pytest.fixture(scope="module")
def fit_x_reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit_x_reference")
    job = run_job(fit_x_script(root), root / "run", *FIT_X_FLAGS, cwd=root, tier_default=True)
    assert job.returncode == 0, job.output
    assert job.summary["global_step"] == 2 * 14  # 1792 // 128 steps an epoch
    return job, (root / "training_log.csv").read_bytes()


@pytest.mark.slow
def test_fit_x_without_y_kill_chief_mid_epoch_ends_with_the_uninterrupted_digest_and_csv(tmp_path, fit_x_reference):
    # The default test_a_gan_with_two_optimizers_kill_chief_mid_epoch_... covers the own train_step's restore.
    reference, csv_log = fit_x_reference
    killed = run_job(fit_x_script(tmp_path), tmp_path / "run", *FIT_X_FLAGS, cwd=tmp_path, tier_default=True,
                     faults=[{"point": "after_commit", "global_step": 20, "rank": 0}])
    assert killed.returncode == 0, killed.output
    assert killed.summary["restarts"] == 1
    assert [r["global_step"] for r in killed.named("restored")] == [20]  # mid-epoch 1 (14 steps an epoch)
    assert killed.summary["weights_sha256"] == reference.summary["weights_sha256"]
    # Every step leaves the trackers in the state a restore gives (own_step.py OwnStep.fold), so
    # the resumed epoch's reconstruction_loss and kl_loss are the uninterrupted run's bit for bit
    # (before: 5.373217582702637 against 5.373218059539795).
    assert_csv_but_loss(tmp_path / "training_log.csv", csv_log)
    assert [without_loss(e) for e in epoch_logs(killed)] == [without_loss(e) for e in epoch_logs(reference)]


@pytest.mark.slow
def test_fit_x_without_y_sigterm_saves_exits_143_and_the_rerun_ends_with_the_uninterrupted_digest_and_csv(
        tmp_path, fit_x_reference):
    # The kill test above covers the restore; this one the agreed save of a SIGTERM inside epoch 1.
    reference, csv_log = fit_x_reference
    script = fit_x_script(tmp_path, sleep=0.2)
    flags = (*FIT_X_FLAGS, "--steps-per-execution", "1")
    epoch_0_done = lambda events: any(e["event"] == "epoch_finished" and e["epoch"] == 0 for e in events)  # noqa: E731
    preempted = run_job_until(script, tmp_path / "run", *flags, when=epoch_0_done, cwd=tmp_path, tier_default=True,
                              action=lambda proc, events: proc.send_signal(signal.SIGTERM))
    assert preempted.returncode == EXIT_PREEMPTED, preempted.output
    [stop] = preempted.named("preempted")
    assert 14 < stop["global_step"] < 28, stop  # inside epoch 1
    rerun = run_job(script, tmp_path / "run", *flags, cwd=tmp_path, tier_default=True)
    assert rerun.returncode == 0, rerun.output
    assert [r["global_step"] for r in rerun.named("restored")] == [stop["global_step"]]
    assert rerun.summary["lost_steps"] == 0
    assert rerun.summary["weights_sha256"] == reference.summary["weights_sha256"]
    assert_csv_but_loss(tmp_path / "training_log.csv", csv_log)


def assert_csv_but_loss(path, expected):
    """``path``'s CSV log is ``expected`` byte for byte but for "loss", the VAE's total tracker,
    compared to float32 rounding: it is not reproducible on two workers even without a fault
    (2026-11-29, load 11-17: two uninterrupted runs of this script logged epoch 1's loss as
    5.392406940460205 and 5.392407417297363, one ulp apart, with the same weights digest and the
    same reconstruction_loss and kl_loss; in another pair epoch 0, before any fault, 5.568417549133301
    against 5.568418025970459; cause not found. The total is the tracker updated first after
    apply_gradients)."""
    ours, theirs = (list(csv.DictReader(io.StringIO(text))) for text in (path.read_text(), expected.decode()))
    assert [without_loss(row) for row in ours] == [without_loss(row) for row in theirs]
    assert all(math.isclose(float(a["loss"]), float(b["loss"]), rel_tol=REL) for a, b in zip(ours, theirs, strict=True))
