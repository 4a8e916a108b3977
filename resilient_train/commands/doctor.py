"""``resilient-train doctor``: check this machine before training, one line per finding.

Each check returns a :class:`Finding`: ``ok``, ``warn`` or ``fail`` with what it saw and,
unless ok, a one-line fix. The command exits 1 when any check failed, so a job script
can run it as a gate. Everything that touches the machine (TensorFlow, devices,
``nvidia-smi``, sockets, storage, the environment, the clock) comes in through
:class:`Probes`, so the GPU paths are tested with fakes on machines that have no GPU.

One check is about security, not readiness (``exposed_ports``): TensorFlow 2.21's gRPC
server binds every worker port on all interfaces (``0.0.0.0``/``[::]``, hard-coded in
``grpc_server_lib.cc``) and runs, unauthenticated, whatever graph a peer sends. The check
warns (never fails: a cluster needs those interfaces) when the host has an address
outside loopback, so the ports are reachable from the network; docs/security.md says what
to do.

What it refuses to do: allocate GPU memory beyond TensorFlow's own device initialisation
(memory growth is switched on first, and ``nvidia-smi`` is preferred when present), or
write to storage outside one probe object that it deletes again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

from resilient_train.cluster.ports import free_ports
from resilient_train.errors import EXIT_FAILURE, EXIT_OK

__all__ = ["add_parser", "main", "Finding", "Probes", "run_checks", "doctor_command", "check_exposed_ports"]

OK, WARN, FAIL = "ok", "warn", "fail"
_SUPPORTED_TF = ((2, 20), (2, 22))  # pyproject: tensorflow>=2.20,<2.22
_PORTS_NEEDED = 4


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    detail: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.status not in (OK, WARN, FAIL):
            raise ValueError(f"Received status={self.status!r}; expected ok, warn or fail")


@dataclass(frozen=True)
class GpuMemory:
    name: str
    total_mib: int | None
    used_mib: int | None
    source: str  # "nvidia-smi" or "tensorflow"


def _nvidia_smi() -> str | None:
    """``nvidia-smi``'s per-GPU CSV (index, name, total, used MiB), or None without one."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        return subprocess.run(
            [binary, "--query-gpu=index,name,memory.total,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _tf_versions() -> dict[str, Any]:
    import keras
    import tensorflow as tf

    build = dict(tf.sysconfig.get_build_info())
    return {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "is_cuda_build": bool(build.get("is_cuda_build")),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
    }


def _tf_devices() -> list[tuple[str, str]]:
    import tensorflow as tf

    return [(device.device_type, device.name) for device in tf.config.list_physical_devices()]


def _tf_gpu_memory() -> list[GpuMemory]:
    """This process's TensorFlow memory use per GPU (TensorFlow reports no totals)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:  # before initialisation: take memory as needed, not all of it
        tf.config.experimental.set_memory_growth(gpu, True)
    found = []
    for index, gpu in enumerate(gpus):
        info = tf.config.experimental.get_memory_info(f"GPU:{index}")
        found.append(GpuMemory(gpu.name, None, info["current"] // 2**20, "tensorflow"))
    return found



def _storage_roundtrip(url: str, options: Mapping[str, Any]) -> float:
    """Write, read back and delete one probe object under ``url``; seconds taken."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **dict(options))
    path = f"{root.rstrip('/')}/.rt-doctor-{uuid.uuid4().hex[:8]}"
    payload = b"resilient-train doctor probe\n"
    started = time.perf_counter()
    fs.makedirs(root, exist_ok=True)
    fs.pipe_file(path, payload)
    try:
        if fs.cat_file(path) != payload:
            raise OSError(f"read back different bytes from {path}")
    finally:
        fs.rm_file(path)
    return time.perf_counter() - started


def _interfaces() -> list[tuple[str, str]]:
    """``(interface, address)`` for every IPv4/IPv6 address of an interface that is up."""
    import socket

    import psutil

    stats = psutil.net_if_stats()
    found = []
    for name, addresses in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                found.append((name, address.address.split("%", 1)[0]))
    return found


@dataclass
class Probes:
    """The machine, as the checks see it; tests pass fakes."""

    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    python_version: Callable[[], str] = platform.python_version
    tf_versions: Callable[[], dict[str, Any]] = _tf_versions
    devices: Callable[[], list[tuple[str, str]]] = _tf_devices
    nvidia_smi: Callable[[], str | None] = _nvidia_smi
    tf_gpu_memory: Callable[[], list[GpuMemory]] = _tf_gpu_memory
    free_port: Callable[[], int] = lambda: free_ports(1)[0]
    storage_roundtrip: Callable[[str, Mapping[str, Any]], float] = _storage_roundtrip
    interfaces: Callable[[], list[tuple[str, str]]] = _interfaces


# ------------------------------------------------------------------ checks


def check_python(probes: Probes) -> Finding:
    version = probes.python_version()
    major, minor = (int(part) for part in version.split(".")[:2])
    if (major, minor) < (3, 10):
        return Finding("python", FAIL, version, "install Python 3.10 or newer (3.11 is what CI uses)")
    return Finding("python", OK, version)


def check_tensorflow(probes: Probes) -> tuple[Finding, dict[str, Any] | None]:
    try:
        info = probes.tf_versions()
    except ImportError as exc:
        return Finding("tensorflow", FAIL, f"cannot import: {exc}", "pip install 'tensorflow>=2.20,<2.22'"), None
    version = tuple(int(part) for part in info["tensorflow"].split(".")[:2])
    low, high = _SUPPORTED_TF
    detail = f"tensorflow {info['tensorflow']}, keras {info['keras']}"
    if not low <= version < high:
        return Finding("tensorflow", WARN, f"{detail} (tested: >=2.20,<2.22)",
                       "pip install 'tensorflow>=2.20,<2.22'", data=info), info
    if not str(info["keras"]).startswith("3."):
        return Finding("tensorflow", FAIL, f"{detail}; Keras 3 is required", "pip install 'keras>=3'", data=info), info
    return Finding("tensorflow", OK, detail, data=info), info


def check_build(info: dict[str, Any]) -> Finding:
    if not info.get("is_cuda_build"):
        return Finding("tf_build", OK, "CPU-only build (no CUDA)", data=info)
    return Finding("tf_build", OK, f"CUDA {info.get('cuda_version')}, cuDNN {info.get('cudnn_version')}", data=info)


def check_devices(probes: Probes, info: dict[str, Any], gpus_wanted: int) -> tuple[Finding, int]:
    devices = probes.devices()
    gpus = [name for kind, name in devices if kind == "GPU"]
    detail = ", ".join(name.replace("/physical_device:", "") for _, name in devices) or "none"
    data = {"devices": [list(device) for device in devices]}
    if gpus_wanted > len(gpus):
        return Finding("devices", FAIL, f"{detail}; {gpus_wanted} GPU(s) needed, {len(gpus)} visible",
                       "lower --workers or --gpus-per-worker, or make more GPUs visible (CUDA_VISIBLE_DEVICES)",
                       data=data), len(gpus)
    if info.get("is_cuda_build") and not gpus:
        return Finding("devices", WARN, f"{detail}; a CUDA build sees no GPU",
                       "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES; training will run on CPU",
                       data=data), 0
    return Finding("devices", OK, detail, data=data), len(gpus)


def _parse_smi(text: str) -> list[GpuMemory]:
    found = []
    for line in text.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 4:
            found.append(GpuMemory(f"GPU {parts[0]} {parts[1]}", int(float(parts[2])), int(float(parts[3])), "nvidia-smi"))
    return found


def check_gpu_memory(probes: Probes, gpu_count: int) -> Finding:
    if gpu_count == 0:
        return Finding("gpu_memory", OK, "no GPU visible")
    smi = probes.nvidia_smi()
    memory = _parse_smi(smi) if smi else probes.tf_gpu_memory()
    data = {"gpus": [asdict(m) for m in memory]}
    lines = []
    busy = []
    for m in memory:
        if m.total_mib:
            lines.append(f"{m.name}: {m.used_mib}/{m.total_mib} MiB used")
            if m.used_mib is not None and m.used_mib > 0.5 * m.total_mib:
                busy.append(m.name)
        else:
            lines.append(f"{m.name}: {m.used_mib} MiB used by TensorFlow here (total unknown without nvidia-smi)")
    if busy:
        return Finding("gpu_memory", WARN, "; ".join(lines),
                       f"another process holds over half of {', '.join(busy)}: stop it or pick other GPUs", data=data)
    return Finding("gpu_memory", OK, "; ".join(lines) or "no memory information", data=data)


def check_cuda_visible_devices(probes: Probes, gpu_count: int) -> Finding:
    value = probes.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return Finding("cuda_visible_devices", OK, "not set (every GPU visible; --gpus-per-worker slices them)")
    if value.strip() in ("", "-1"):
        return Finding("cuda_visible_devices", WARN, f"{value!r} hides every GPU",
                       "unset CUDA_VISIBLE_DEVICES to train on GPUs (or keep it to force CPU)")
    return Finding("cuda_visible_devices", OK, f"{value!r} ({gpu_count} GPU(s) visible)")


def check_tf_config(probes: Probes) -> Finding:
    from resilient_train.cluster.tf_config import parse_tf_config

    text = probes.environ.get("TF_CONFIG")
    if text is None:
        return Finding("tf_config", OK, "not set (`run` writes one per worker)")
    try:
        cluster = parse_tf_config(text)
    except (ValueError, KeyError, TypeError) as exc:
        return Finding("tf_config", FAIL, f"set but does not parse: {exc}",
                       "unset TF_CONFIG (`run` sets its own) or fix it for `resilient-train worker`")
    return Finding("tf_config", WARN, f"set: {cluster.role} rank {cluster.rank} of {cluster.num_workers}",
                   "a stale TF_CONFIG is used by `resilient-train worker`; unset it unless a launcher set it")


def check_ports(probes: Probes) -> Finding:
    try:
        ports = sorted({probes.free_port() for _ in range(_PORTS_NEEDED)})
    except OSError as exc:
        return Finding("loopback_ports", FAIL, f"cannot bind 127.0.0.1: {exc}",
                       "allow binding loopback TCP ports (local workers talk over 127.0.0.1)")
    return Finding("loopback_ports", OK, f"{len(ports)} free, e.g. {ports[0]}", data={"ports": ports})


def check_exposed_ports(probes: Probes) -> Finding:
    """Warn when TensorFlow's all-interfaces listener would be reachable from outside this host."""
    import ipaddress

    try:
        addresses = probes.interfaces()
    except OSError as exc:
        return Finding("exposed_ports", WARN, f"cannot list network interfaces: {exc}",
                       "assume worker ports are reachable from the network; see docs/security.md")
    outside = [(name, addr) for name, addr in addresses if not ipaddress.ip_address(addr).is_loopback]
    if not outside:
        return Finding("exposed_ports", OK, "only loopback interfaces: worker ports are not reachable from outside")
    shown = ", ".join(f"{name} {addr}" for name, addr in outside)
    return Finding(
        "exposed_ports", WARN,
        f"TensorFlow worker ports listen on every interface (unauthenticated gRPC) while training; this host has {shown}",
        "keep worker ports on a private network or behind a firewall; TensorFlow cannot bind them to one address "
        "(docs/security.md)",
        data={"addresses": [list(pair) for pair in outside]},
    )


def check_storage(probes: Probes, url: str, options: Mapping[str, Any]) -> Finding:
    try:
        seconds = probes.storage_roundtrip(url, options)
    except Exception as exc:  # any backend's error: the finding names it
        return Finding("storage", FAIL, f"{url}: {type(exc).__name__}: {exc}",
                       "check the URL, credentials and --storage-option endpoint; the run needs write access")
    detail = f"{url}: writable, round trip {seconds * 1000:.1f} ms"
    if seconds > 2.0:
        return Finding("storage", WARN, detail, "storage is slow: checkpoints will take long to commit",
                       data={"roundtrip_s": seconds})
    return Finding("storage", OK, detail, data={"roundtrip_s": seconds})


def run_checks(
    probes: Probes | None = None,
    *,
    storage: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    workers: int = 1,
    gpus_per_worker: int = 0,
) -> list[Finding]:
    """Every check, in the order the report shows them."""
    probes = probes or Probes()
    findings = [check_python(probes)]
    tf_finding, info = check_tensorflow(probes)
    findings.append(tf_finding)
    if info is not None:
        findings.append(check_build(info))
        devices, gpu_count = check_devices(probes, info, workers * gpus_per_worker)
        findings += [devices, check_gpu_memory(probes, gpu_count), check_cuda_visible_devices(probes, gpu_count)]
    findings += [check_tf_config(probes), check_ports(probes), check_exposed_ports(probes)]
    if storage:
        findings.append(check_storage(probes, storage, storage_options or {}))
    return findings


def render(findings: Sequence[Finding]) -> str:
    width = max(len(f.check) for f in findings)
    lines = []
    for f in findings:
        lines.append(f"{f.status:<4}  {f.check:<{width}}  {f.detail}")
        if f.fix:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {f.fix}")
    return "\n".join(lines)


def doctor_command(
    *,
    as_json: bool,
    storage: str | None,
    storage_options: Mapping[str, Any],
    workers: int,
    gpus_per_worker: int,
    probes: Probes | None = None,
    out=None,
) -> int:
    out = out or sys.stdout
    findings = run_checks(probes, storage=storage, storage_options=storage_options,
                          workers=workers, gpus_per_worker=gpus_per_worker)
    failed = any(f.status == FAIL for f in findings)
    if as_json:
        out.write(json.dumps({"ok": not failed, "checks": [asdict(f) for f in findings]}, indent=2, default=str) + "\n")
    else:
        out.write(render(findings) + "\n")
    return EXIT_FAILURE if failed else EXIT_OK


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("doctor", help="check Python, TensorFlow, GPUs, environment, ports (and their exposure) and storage")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--storage", metavar="URL", help="also check that URL is reachable and writable")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--workers", type=int, default=1, help="with --gpus-per-worker: GPUs needed = workers x G")
    parser.add_argument("--gpus-per-worker", type=int, default=0, metavar="G")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from resilient_train.checkpoint import parse_storage_options

    return doctor_command(as_json=args.json, storage=args.storage,
                          storage_options=parse_storage_options(args.storage_option),
                          workers=args.workers, gpus_per_worker=args.gpus_per_worker)
