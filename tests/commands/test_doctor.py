"""`resilient-train doctor` with fake probes: every status path, GPU ones included."""

import io
import json

import pytest

from resilient_train.commands.doctor import FAIL, OK, WARN, GpuMemory, Probes, doctor_command, run_checks

CPU_TF = {"tensorflow": "2.21.0", "keras": "3.15.1", "is_cuda_build": False, "cuda_version": None, "cudnn_version": None}
CUDA_TF = {**CPU_TF, "is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"}
TWO_GPUS = [("CPU", "/physical_device:CPU:0"), ("GPU", "/physical_device:GPU:0"), ("GPU", "/physical_device:GPU:1")]
SMI = "0, NVIDIA H100 80GB HBM3, 81559, 1024\n1, NVIDIA H100 80GB HBM3, 81559, 60000\n"


def fake(**overrides) -> Probes:
    ports = iter(range(40000, 40100))
    values = dict(
        environ={},
        python_version=lambda: "3.11.7",
        tf_versions=lambda: CPU_TF,
        devices=lambda: [("CPU", "/physical_device:CPU:0")],
        nvidia_smi=lambda: None,
        tf_gpu_memory=lambda: [],
        free_port=lambda: next(ports),
        storage_roundtrip=lambda url, options: 0.004,
        interfaces=lambda: [("lo", "127.0.0.1"), ("lo", "::1")],
    )
    values.update(overrides)
    return Probes(**values)


def by_check(findings):
    return {f.check: (f.status, f.detail) for f in findings}


def test_cpu_machine_is_all_ok():
    found = by_check(run_checks(fake(), storage="memory://x"))
    assert found == {
        "python": (OK, "3.11.7"),
        "tensorflow": (OK, "tensorflow 2.21.0, keras 3.15.1"),
        "tf_build": (OK, "CPU-only build (no CUDA)"),
        "devices": (OK, "CPU:0"),
        "gpu_memory": (OK, "no GPU visible"),
        "cuda_visible_devices": (OK, "not set (every GPU visible; --gpus-per-worker slices them)"),
        "tf_config": (OK, "not set (`run` writes one per worker)"),
        "loopback_ports": (OK, "4 free, e.g. 40000"),
        "exposed_ports": (OK, "only loopback interfaces: worker ports are not reachable from outside"),
        "storage": (OK, "memory://x: writable, round trip 4.0 ms"),
    }


def test_gpu_machine_reads_nvidia_smi_and_flags_a_busy_gpu():
    found = {f.check: f for f in run_checks(fake(tf_versions=lambda: CUDA_TF, devices=lambda: TWO_GPUS,
                                                 nvidia_smi=lambda: SMI, environ={"CUDA_VISIBLE_DEVICES": "0,1"}))}
    assert found["tf_build"].detail == "CUDA 12.5.1, cuDNN 9"
    assert found["devices"].detail == "CPU:0, GPU:0, GPU:1"
    assert found["gpu_memory"].status == WARN
    assert found["gpu_memory"].detail == (
        "GPU 0 NVIDIA H100 80GB HBM3: 1024/81559 MiB used; GPU 1 NVIDIA H100 80GB HBM3: 60000/81559 MiB used"
    )
    assert "GPU 1 NVIDIA H100 80GB HBM3" in found["gpu_memory"].fix
    assert (found["cuda_visible_devices"].status, found["cuda_visible_devices"].detail) == (OK, "'0,1' (2 GPU(s) visible)")


def test_without_nvidia_smi_tensorflow_memory_info_is_used():
    memory = [GpuMemory("/physical_device:GPU:0", None, 0, "tensorflow")]
    found = {f.check: f for f in run_checks(fake(tf_versions=lambda: CUDA_TF, devices=lambda: TWO_GPUS[:2],
                                                 tf_gpu_memory=lambda: memory))}
    assert found["gpu_memory"].status == OK
    assert found["gpu_memory"].detail == "/physical_device:GPU:0: 0 MiB used by TensorFlow here (total unknown without nvidia-smi)"


def test_gpus_per_worker_beyond_the_visible_gpus_fails():
    found = {f.check: f for f in run_checks(fake(tf_versions=lambda: CUDA_TF, devices=lambda: TWO_GPUS,
                                                 nvidia_smi=lambda: SMI), workers=3, gpus_per_worker=1)}
    assert found["devices"].status == FAIL
    assert found["devices"].detail.endswith("3 GPU(s) needed, 2 visible")


def test_cuda_build_without_gpu_and_hidden_gpus_warn():
    found = {f.check: f for f in run_checks(fake(tf_versions=lambda: CUDA_TF, environ={"CUDA_VISIBLE_DEVICES": "-1"}))}
    assert found["devices"].status == WARN and "sees no GPU" in found["devices"].detail
    assert (found["cuda_visible_devices"].status, found["cuda_visible_devices"].detail) == (WARN, "'-1' hides every GPU")


def test_tf_config_in_the_environment():
    good = '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 1}}'
    found = {f.check: f for f in run_checks(fake(environ={"TF_CONFIG": good}))}
    assert (found["tf_config"].status, found["tf_config"].detail) == (WARN, "set: worker rank 1 of 2")
    found = {f.check: f for f in run_checks(fake(environ={"TF_CONFIG": "{bad"}))}
    assert found["tf_config"].status == FAIL and found["tf_config"].detail.startswith("set but does not parse: TF_CONFIG is not valid JSON")


@pytest.mark.parametrize(
    "probes, check, status",
    [
        (dict(python_version=lambda: "3.9.1"), "python", FAIL),
        (dict(tf_versions=lambda: {**CPU_TF, "tensorflow": "2.17.0"}), "tensorflow", WARN),
        (dict(tf_versions=lambda: {**CPU_TF, "keras": "2.15.0"}), "tensorflow", FAIL),
    ],
)
def test_versions(probes, check, status):
    assert {f.check: f.status for f in run_checks(fake(**probes))}[check] == status


def test_missing_tensorflow_fails_and_skips_device_checks():
    def no_tf():
        raise ImportError("No module named 'tensorflow'")

    found = by_check(run_checks(fake(tf_versions=no_tf)))
    assert found["tensorflow"] == (FAIL, "cannot import: No module named 'tensorflow'")
    assert "devices" not in found and "tf_build" not in found


def test_unwritable_storage_fails_and_the_command_exits_1():
    def denied(url, options):
        raise PermissionError(13, "Permission denied")

    out = io.StringIO()
    code = doctor_command(as_json=True, storage="s3://bucket/run", storage_options={}, workers=1, gpus_per_worker=0,
                          probes=fake(storage_roundtrip=denied), out=out)
    report = json.loads(out.getvalue())
    storage = next(c for c in report["checks"] if c["check"] == "storage")
    assert (code, report["ok"], storage["status"]) == (1, False, FAIL)
    assert storage["detail"] == "s3://bucket/run: PermissionError: [Errno 13] Permission denied"
    assert storage["fix"].startswith("check the URL, credentials")


def test_text_report_has_a_fix_line_under_each_problem():
    out = io.StringIO()
    code = doctor_command(as_json=False, storage=None, storage_options={}, workers=1, gpus_per_worker=0,
                          probes=fake(environ={"CUDA_VISIBLE_DEVICES": ""}, tf_versions=lambda: CUDA_TF), out=out)
    lines = out.getvalue().splitlines()
    assert code == 0
    assert lines[3].startswith("warn  devices") and lines[4].strip().startswith("fix: check the driver")


def test_real_storage_roundtrip_on_local_disk(tmp_path):
    found = {f.check: f for f in run_checks(Probes(tf_versions=lambda: CPU_TF, devices=lambda: []), storage=str(tmp_path))}
    assert found["storage"].status == OK
    assert list(tmp_path.iterdir()) == []  # the probe object is deleted again


def test_the_real_command_on_this_machine(capsys, monkeypatch, tmp_path):
    from resilient_train.cli import main

    monkeypatch.delenv("TF_CONFIG", raising=False)
    code = main(["doctor", "--json", "--storage", str(tmp_path)])
    report = json.loads(capsys.readouterr().out)
    assert [c["check"] for c in report["checks"]] == [
        "python", "tensorflow", "tf_build", "devices", "gpu_memory", "cuda_visible_devices", "tf_config",
        "loopback_ports", "exposed_ports", "storage",
    ]
    assert code == (0 if report["ok"] else 1)
    assert all(c["status"] in (OK, WARN) for c in report["checks"]), report  # nothing fails on a CPU test machine


def test_non_loopback_interfaces_warn_that_worker_ports_are_exposed():
    lister = lambda: [("lo", "127.0.0.1"), ("eth0", "192.0.2.2"), ("lo", "::1"), ("eth0", "fd00::2")]
    found = {f.check: f for f in run_checks(fake(interfaces=lister))}
    exposed = found["exposed_ports"]
    assert (exposed.status, exposed.detail) == (
        WARN,
        "TensorFlow worker ports listen on every interface (unauthenticated gRPC) while training; "
        "this host has eth0 192.0.2.2, eth0 fd00::2",
    )
    assert exposed.fix == (
        "keep worker ports on a private network or behind a firewall; TensorFlow cannot bind them to one "
        "address (docs/security.md)"
    )
    assert exposed.data == {"addresses": [["eth0", "192.0.2.2"], ["eth0", "fd00::2"]]}
    out = io.StringIO()
    code = doctor_command(as_json=False, storage=None, storage_options={}, workers=1, gpus_per_worker=0,
                          probes=fake(interfaces=lister), out=out)
    assert code == 0  # a warning, never a failure: a cluster needs its interfaces


def test_an_unlistable_interface_table_warns():
    def broken():
        raise OSError("no netlink")

    exposed = {f.check: f for f in run_checks(fake(interfaces=broken))}["exposed_ports"]
    assert (exposed.status, exposed.detail) == (WARN, "cannot list network interfaces: no netlink")


def test_the_real_interface_lister_sees_loopback():
    from resilient_train.commands.doctor import _interfaces

    assert ("127.0.0.1" in {addr for _, addr in _interfaces()})
