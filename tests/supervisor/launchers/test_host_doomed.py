"""Launcher.host_doomed: a worker's preemption notice (attempt-<n>/notice-<rank>.json) stops a
local run, whose every worker shares the supervisor's host; other launchers restart."""

from __future__ import annotations

import json

from resilient_train.job.config import JobConfig
from resilient_train.rundir.layout import RunDir
from resilient_train.supervisor.launchers.api import Launcher
from resilient_train.supervisor.launchers.local import LocalLauncher


def test_a_notice_marker_dooms_the_local_host_and_names_the_provider(tmp_path):
    attempt_dir = RunDir(tmp_path).attempt(2)
    attempt_dir.path.mkdir(parents=True)
    launcher = LocalLauncher(JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path)))
    assert launcher.host_doomed(attempt_dir) is None
    attempt_dir.notice(1).write_text(json.dumps({"provider": "aws", "kind": "spot_terminate", "deadline": None}))
    assert launcher.host_doomed(attempt_dir) == "notice:aws"
    attempt_dir.notice(0).write_text("{torn")  # a marker that does not parse still dooms the host
    assert launcher.host_doomed(attempt_dir) == "notice:unknown"


def test_other_launchers_restart_by_default(tmp_path):
    attempt_dir = RunDir(tmp_path).attempt(1)
    attempt_dir.path.mkdir(parents=True)
    attempt_dir.notice(0).write_text(json.dumps({"provider": "gce", "kind": "preempted", "deadline": None}))


    class Elsewhere(Launcher):  # workers on other hosts (Ray, Slurm): the default
        def start(self, specs):
            return []

    assert Elsewhere().host_doomed(attempt_dir) is None


def test_a_replaced_stragglers_marker_dooms_no_host_but_a_notice_beside_it_does(tmp_path):
    """runner/health/straggler_replace.py's marker: the host is slow, not going; the local restart
    starts a fresh process there."""
    attempt_dir = RunDir(tmp_path).attempt(1)
    attempt_dir.path.mkdir(parents=True)
    launcher = LocalLauncher(JobConfig(recipe="recipes/linear_regression.py", run_dir=str(tmp_path)))
    attempt_dir.notice(1).write_text(json.dumps({"provider": "straggler", "kind": "replace", "host": "127.0.0.1"}))
    assert launcher.host_doomed(attempt_dir) is None
    attempt_dir.notice(0).write_text(json.dumps({"provider": "gce", "kind": "preempted", "deadline": None}))
    assert launcher.host_doomed(attempt_dir) == "notice:gce"
