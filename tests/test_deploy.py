"""deploy/: the manifests and batch scripts the README points to, checked for what it promises.

Nothing here talks to Kubernetes or Slurm (tests/integration/test_slurm.py runs the sbatch
scripts on a real local Slurm): the YAML must parse, run `resilient-train worker` with the
storage on S3, and encode the exit-code policy the README describes.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml



DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def _load(name: str) -> dict:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))
    assert len(documents) == 1
    return documents[0]


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_jobset_gang_restart_and_exit_code_policy():
    jobset = _load("jobset.yaml")
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    spec = jobset["spec"]
    assert spec["failurePolicy"]["maxRestarts"] >= 1
    assert spec["failurePolicy"]["rules"] == [
        {"name": "fatal-exit-code-3", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
    ]
    (workers,) = spec["replicatedJobs"]
    job = workers["template"]["spec"]
    assert job["backoffLimit"] == 0 and job["completionMode"] == "Indexed"
    rules = job["podFailurePolicy"]["rules"]
    by_code = {code: rule["action"] for rule in rules for code in rule.get("onExitCodes", {}).get("values", [])}
    assert by_code == {143: "Ignore", 3: "FailJob"}
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    script = container["args"][0]
    assert "exec resilient-train worker" in script and "--storage s3://" in script
    workers_flag = int(re.search(r"--workers (\d+)", script).group(1))
    grace = float(re.search(r"--grace-period (\d+)", script).group(1))
    assert job["parallelism"] == job["completions"] == workers_flag
    assert pod["terminationGracePeriodSeconds"] > grace
    tf_config = re.search(r'TF_CONFIG="(.*)"\n', script).group(1).replace('\\"', '"')
    tf_config = json.loads(tf_config.replace("${JOB_COMPLETION_INDEX}", "1"))
    assert len(tf_config["cluster"]["worker"]) == workers_flag and tf_config["task"] == {"type": "worker", "index": 1}


def test_tfjob_restart_policy_exit_code_runs_the_worker_on_s3():
    tfjob = _load("tfjob.yaml")
    assert (tfjob["apiVersion"], tfjob["kind"]) == ("kubeflow.org/v1", "TFJob")
    worker = tfjob["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["restartPolicy"] == "ExitCode"
    pod = worker["template"]["spec"]
    (container,) = pod["containers"]
    argv = container["command"]
    assert argv[:2] == ["resilient-train", "worker"]
    assert _flag(argv, "--storage").startswith("s3://")
    assert int(_flag(argv, "--workers")) == worker["replicas"]
    assert pod["terminationGracePeriodSeconds"] > float(_flag(argv, "--grace-period"))
    assert container["name"] == "tensorflow"


@pytest.mark.parametrize("name", ["run.sbatch", "workers.sbatch"])
def test_sbatch_scripts_are_valid_bash_and_requeue(name):
    path = DEPLOY / "slurm" / name
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True, timeout=30).returncode == 0
    text = path.read_text()
    assert "#SBATCH --requeue" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text
    expected = "run --launcher slurm" if name == "run.sbatch" else "worker --tf-config-from slurm"
    assert expected in text
