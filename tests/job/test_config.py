import pytest

from resilient_train.job.config import JobConfig, load_toml, parse_set_pairs
from resilient_train.errors import ConfigError


def test_defaults_derive_run_dir_and_storage_from_recipe_name():
    job = JobConfig(recipe="recipes/digits_cnn.py")
    assert (job.workers, job.run_dir, job.storage, job.keep) == (2, "runs/digits_cnn", "runs/digits_cnn/checkpoints", 3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"workers": 0}, "Received workers=0; expected an integer >= 1"),
        ({"steps_per_epoch": -3}, "Received steps_per_epoch=-3; expected an integer >= 1"),
        ({"epochs": 0}, "Received epochs=0; expected an integer >= 1"),
        ({"save_every_steps": -1}, "Received save_every_steps=-1; expected an integer >= 0"),
        ({"keep": 0}, "Received keep=0; expected an integer >= 1"),
        ({"eval_steps": 0}, "Received eval_steps=0; expected an integer >= 1"),
        ({"eval_every_epochs": -1}, "Received eval_every_epochs=-1; expected an integer >= 0"),
        ({"max_iterator_state_bytes": -1}, "Received max_iterator_state_bytes=-1; expected an integer >= 0"),
        ({"grace_period": 0}, "Received grace_period=0; expected a number of seconds > 0"),
        ({"progress_every_s": -1}, "Received progress_every_s=-1; expected a finite number of seconds >= 0"),
        ({"progress_every_s": "1s"}, "Received progress_every_s='1s'; expected a finite number of seconds >= 0"),
        ({"workers": 3, "global_batch_size": 8}, "global_batch_size=8 with workers=3"),
        ({"hang_timeout": 0}, "Received hang_timeout=0; expected 'auto' or a number of seconds > 0"),
        ({"hang_timeout": "soon"}, "Received hang_timeout='soon'; expected 'auto' or a number of seconds > 0"),
        ({"startup_timeout": -1}, "Received startup_timeout=-1; expected a number of seconds > 0"),
        ({"storage_timeout": 0}, "Received storage_timeout=0; expected a finite number of seconds > 0"),
        ({"storage_timeout": float("inf")}, "Received storage_timeout=inf; expected a finite number of seconds > 0"),
        ({"storage_timeout": "1m"}, "Received storage_timeout='1m'; expected a finite number of seconds > 0"),
        ({"collective_timeout": 0}, "Received collective_timeout=0; expected 'off' or a finite number of seconds > 0"),
        ({"collective_timeout": float("inf")}, "Received collective_timeout=inf; expected 'off' or a finite number of seconds > 0"),
        ({"collective_timeout": "never"}, "Received collective_timeout='never'; expected 'off' or a finite number of seconds > 0"),
    ],
)
def test_bad_values_are_named(kwargs, message):
    with pytest.raises(ConfigError) as info:
        JobConfig(recipe="r.py", **kwargs)
    assert message in str(info.value)


def test_recipe_defaults_fill_only_unset_values():
    job = JobConfig(recipe="r.py", epochs=7).with_recipe_defaults({"epochs": 2, "steps_per_epoch": 9})
    assert (job.epochs, job.steps_per_epoch, job.global_batch_size, job.save_every_steps) == (7, 9, 32, 10)


def test_json_round_trip():
    job = JobConfig(recipe="r.py", params={"a": "1"}, storage_options={"anon": True}, epochs=2)
    assert JobConfig.from_json(job.to_json()) == job


def test_unknown_toml_key_is_rejected(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('recipe = "r.py"\nwokers = 3\n')
    with pytest.raises(ConfigError, match=r"Unknown key\(s\) \['wokers'\]"):
        JobConfig.from_mapping(load_toml(str(path)), source=str(path))


def test_broken_toml_and_missing_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("recipe = \n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_toml(str(path))
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(str(tmp_path / "missing.toml"))


def test_set_pairs():
    assert parse_set_pairs(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ConfigError, match=r"Received --set 'novalue'; expected key=value"):
        parse_set_pairs(["novalue"])


def test_hang_flags_parse_seconds_or_auto():
    import argparse

    from resilient_train.job.config import add_job_arguments, job_from_args

    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    add_job_arguments(parser)
    default = job_from_args(parser.parse_args(["r.py"]))
    assert (default.hang_timeout, default.startup_timeout) == ("auto", 600.0)
    job = job_from_args(parser.parse_args(["r.py", "--hang-timeout", "31", "--startup-timeout", "90"]))
    assert (job.hang_timeout, job.startup_timeout) == (31.0, 90.0)
    assert job_from_args(parser.parse_args(["r.py", "--hang-timeout", "auto"])).hang_timeout == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["r.py", "--hang-timeout", "never"])


def test_collective_timeout_is_off_by_default_and_parses_seconds_or_off(capsys):
    import argparse
    import json

    from resilient_train.job.config import add_job_arguments, job_from_args

    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    add_job_arguments(parser)
    assert job_from_args(parser.parse_args(["r.py"])).collective_timeout is None
    assert job_from_args(parser.parse_args(["r.py", "--collective-timeout", "off"])).collective_timeout is None
    job = job_from_args(parser.parse_args(["r.py", "--collective-timeout", "900"]))
    assert job.collective_timeout == 900.0
    assert JobConfig.from_json(job.to_json()).collective_timeout == 900.0  # job.json carries it to the workers
    assert json.loads(JobConfig(recipe="r.py", collective_timeout="off").to_json())["collective_timeout"] is None
    with pytest.raises(SystemExit):
        parser.parse_args(["r.py", "--collective-timeout", "soon"])
    assert "argument --collective-timeout: 'soon' is not a number of seconds or off" in capsys.readouterr().err


def test_storage_timeout_flag_reaches_the_job_and_defaults_to_the_stores_deadline():
    import argparse

    from resilient_train.checkpoint.retry import DEFAULT_STALL_TIMEOUT_S
    from resilient_train.job.config import add_job_arguments, job_from_args

    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    add_job_arguments(parser)
    assert job_from_args(parser.parse_args(["r.py"])).storage_timeout == DEFAULT_STALL_TIMEOUT_S == 60.0
    assert job_from_args(parser.parse_args(["r.py", "--storage-timeout", "7.5"])).storage_timeout == 7.5
    with pytest.raises(ConfigError, match=r"Received storage_timeout=-2\.0; expected a finite number of seconds > 0"):
        job_from_args(parser.parse_args(["r.py", "--storage-timeout", "-2"]))


# ------------------------------------------------------------ credentials and job.json
def test_job_json_carries_no_credential_and_the_worker_gets_them_back():
    import json

    from resilient_train.cluster.environment import STORAGE_SECRETS, WorkerEnvironment

    job = JobConfig(recipe="recipes/linear_regression.py", storage="https://me:pw@host/ckpts",
                    storage_options={"key": "AKIA1", "secret": "s3cr3t", "client_kwargs": {"endpoint_url": "http://e"}})
    written = json.loads(job.to_json())
    assert written["storage"] == "https://***@host/ckpts"
    assert written["storage_options"] == {"key": "***", "secret": "***", "client_kwargs": {"endpoint_url": "http://e"}}
    assert job.secrets() == {"storage_options": {"key": "AKIA1", "secret": "s3cr3t"},
                             "storage": "https://me:pw@host/ckpts"}
    env = WorkerEnvironment(2, "r", storage_secrets=job.secrets()).to_environ()
    assert json.loads(env[STORAGE_SECRETS]) == job.secrets()
    back = JobConfig.from_json(job.to_json()).with_secrets(WorkerEnvironment.from_environ(env).storage_secrets)
    assert back == job
    assert "s3cr3t" not in repr(job) and "s3cr3t" not in repr(WorkerEnvironment(storage_secrets=job.secrets()))


def test_a_worker_without_the_secrets_drops_the_placeholders():
    job = JobConfig(recipe="recipes/linear_regression.py", storage_options={"key": "AKIA1", "anon": False})
    assert JobConfig.from_json(job.to_json()).with_secrets({}).storage_options == {"anon": False}


def test_a_job_without_credentials_has_no_secrets_and_the_default_mode():
    job = JobConfig(recipe="recipes/linear_regression.py", storage_options={"anon": True})
    assert job.secrets() == {} and job.run_dir_mode == 0o700
    assert JobConfig(recipe="r.py", run_dir_mode="0750").run_dir_mode == 0o750


def test_bad_storage_secrets_variable_does_not_echo_it():
    from resilient_train.cluster.environment import WorkerEnvironment
    from resilient_train.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        WorkerEnvironment.from_environ({"RT_STORAGE_SECRETS": "s3cr3t"})
    assert str(caught.value) == "Received RT_STORAGE_SECRETS that is not a JSON object; expected what the supervisor sets"



@pytest.mark.parametrize(
    "workers, expected",
    [("2", (2, None, False, [2])), ("1:3", (3, 1, True, [1, 2, 3])), ("2:2", (2, None, False, [2]))],
)
def test_workers_min_max_parses_into_max_and_min(workers, expected):
    job = JobConfig(recipe="r.py", workers=workers, global_batch_size=6)
    assert (job.workers, job.min_workers, job.elastic, list(job.world_sizes)) == expected
    assert JobConfig.from_json(job.to_json()) == job


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"workers": "3:2"}, "Received --workers '3:2'; expected MIN <= MAX"),
        ({"workers": "0:2"}, "Received --workers '0:2'; expected N or MIN:MAX with both >= 1"),
        ({"workers": "two"}, "Received --workers 'two'; expected N or MIN:MAX (integers >= 1)"),
        ({"workers": "2:4", "global_batch_size": 32},
         "Received global_batch_size=32 with --workers 2:4; 3 workers cannot split it evenly"),
    ],
)
def test_bad_workers_ranges_are_named(kwargs, message):
    with pytest.raises(ConfigError) as info:
        JobConfig(recipe="r.py", **kwargs)
    assert message in str(info.value)


def test_the_workers_flag_takes_min_max():
    import argparse

    from resilient_train.job.config import add_job_arguments, job_from_args

    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    add_job_arguments(parser)
    job = job_from_args(parser.parse_args(["r.py", "--workers", "1:2"]))
    assert (job.workers, job.min_workers) == (2, 1)


# ------------------------------------------------------------ --snapshot-every (the memory tier)

def test_snapshot_every_is_auto_by_default_and_takes_a_number_of_steps():
    from resilient_train.job.config import JobConfig

    default = JobConfig(recipe="r.py")
    assert (default.snapshot_every, default.snapshot_every_steps, default.memory_tier) == ("auto", None, True)
    job = JobConfig(recipe="r.py", snapshot_every=5)
    assert (job.snapshot_every_steps, job.memory_tier) == (5, True)
    assert JobConfig.from_json(job.to_json()).snapshot_every_steps == 5
    off = JobConfig(recipe="r.py", snapshot_every="off")
    assert (off.memory_tier, off.memory_tier_off_reason) == (False, "--snapshot-every off")


@pytest.mark.parametrize("settings, reason", [
    ({"checkpoint_mode": "sync"}, "checkpoint_mode='sync': the snapshot lives in the async checkpointer's twin"),
    ({"strategy": "parameter-server", "workers": 2}, "strategy='parameter-server': no worker holds the whole state"),
    ({"workers": 1}, "a single worker: no survivor to rescue from"),
])
def test_auto_turns_the_tier_off_where_it_cannot_work_and_says_why(settings, reason):
    from resilient_train.job.config import JobConfig

    job = JobConfig(recipe="r.py", **settings)
    assert (job.snapshot_every, job.memory_tier, job.memory_tier_off_reason) == ("auto", False, reason)


def test_snapshot_every_flag_parses_off_and_n_and_refuses_the_rest():
    import argparse

    from resilient_train.job.config import add_job_arguments, job_from_args

    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    add_job_arguments(parser)
    assert job_from_args(parser.parse_args(["r.py", "--snapshot-every", "4"])).snapshot_every_steps == 4
    assert job_from_args(parser.parse_args(["r.py", "--snapshot-every", "off"])).snapshot_every == "off"
    assert job_from_args(parser.parse_args(["r.py", "--snapshot-every", "auto"])).snapshot_every == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["r.py", "--snapshot-every", "often"])


@pytest.mark.parametrize("settings, message", [
    ({"snapshot_every": "often"}, "Received snapshot_every='often'; expected 'auto', 'off' or an integer number of "
     "steps >= 1"),
    ({"snapshot_every": 0}, "Received snapshot_every=0; expected 'auto', 'off' or an integer"),
    ({"snapshot_every": True}, "Received snapshot_every=True; expected 'auto', 'off' or an integer"),
    ({"snapshot_every": 5, "checkpoint_mode": "sync"},
     "Received snapshot_every=5 with checkpoint_mode='sync'; the memory tier keeps its snapshot in the async "
     "checkpointer's twin: use --checkpoint-mode async"),
    ({"snapshot_every": 5, "snapshot_capture_every": 0},
     "Received snapshot_capture_every=0; expected an integer number of steps >= 1"),
])
def test_snapshot_every_refuses_what_it_cannot_do(settings, message):
    from resilient_train.errors import ConfigError
    from resilient_train.job.config import JobConfig

    with pytest.raises(ConfigError) as raised:
        JobConfig(recipe="r.py", **settings)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize("settings, message", [
    ({"sharded_save": "always"}, "Received sharded_save='always'; expected 'auto', 'on' or 'off'"),
    ({"read_once": "auto"}, "Received read_once='auto'; expected 'on' or 'off'"),
    ({"sharded_save": "on", "checkpoint_mode": "sync"},
     "Received sharded_save='on' with checkpoint_mode='sync' and strategy='mirrored'; each worker writes its share "
     "from the async checkpointer's twin"),
])
def test_sharded_save_refuses_what_it_cannot_do(settings, message):
    from resilient_train.errors import ConfigError
    from resilient_train.job.config import JobConfig

    assert JobConfig(recipe="r.py").sharded_save == "auto"
    assert JobConfig(recipe="r.py", sharded_save="auto", checkpoint_mode="sync").sharded_save == "auto"  # resolves off
    with pytest.raises(ConfigError) as raised:
        JobConfig(recipe="r.py", **settings)
    assert str(raised.value).startswith(message)


def test_straggler_flags_parse_a_fraction_or_off_and_seconds(capsys):
    import argparse

    from resilient_train.job.config import add_job_arguments, job_from_args

    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    add_job_arguments(parser)
    default = job_from_args(parser.parse_args(["r.py"]))
    assert (default.straggler_threshold, default.straggler_window) == (0.5, 20.0)
    job = job_from_args(parser.parse_args(["r.py", "--straggler-threshold", "1", "--straggler-window", "3"]))
    assert (job.straggler_threshold, job.straggler_window) == (1.0, 3.0)
    assert JobConfig.from_json(job.to_json()).straggler_window == 3.0  # job.json carries it to the workers
    assert job_from_args(parser.parse_args(["r.py", "--straggler-threshold", "off"])).straggler_threshold == "off"
    with pytest.raises(ConfigError, match=r"Received straggler_threshold=0\.0; expected a finite number > 0 or 'off'"):
        job_from_args(parser.parse_args(["r.py", "--straggler-threshold", "0"]))
    with pytest.raises(ConfigError, match=r"Received straggler_window=-1\.0; expected a finite number of seconds > 0"):
        job_from_args(parser.parse_args(["r.py", "--straggler-window", "-1"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["r.py", "--straggler-threshold", "slow"])
    assert "argument --straggler-threshold: 'slow' is not a number or 'off'" in capsys.readouterr().err


def test_the_straggler_policy_is_warn_or_replace_with_a_cooldown(capsys):
    import argparse

    from resilient_train.job.config import add_job_arguments, job_from_args

    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    add_job_arguments(parser)
    default = job_from_args(parser.parse_args(["r.py"]))
    assert (default.straggler_policy, default.straggler_cooldown) == ("warn", 600.0)
    job = job_from_args(parser.parse_args(["r.py", "--straggler-policy", "replace", "--straggler-cooldown", "120"]))
    assert (job.straggler_policy, job.straggler_cooldown) == ("replace", 120.0)
    assert JobConfig.from_json(job.to_json()).straggler_policy == "replace"  # job.json carries it to the workers
    with pytest.raises(ConfigError, match=r"Received straggler_cooldown=-1\.0; expected a finite number of seconds >= 0"):
        job_from_args(parser.parse_args(["r.py", "--straggler-cooldown", "-1"]))
    with pytest.raises(ConfigError, match=r"Received straggler_policy='kill'; expected one of warn, replace"):
        JobConfig(recipe="r.py", straggler_policy="kill")
    with pytest.raises(SystemExit):
        parser.parse_args(["r.py", "--straggler-policy", "kill"])
    assert "argument --straggler-policy: invalid choice: 'kill'" in capsys.readouterr().err
