"""``zeropilot calibrate``: start one worker per rank, then one for the speed figures, measure the disk and the host,
write the profile.

The workers (:mod:`zeropilot.calibrate.worker`) import torch; this module does not. Each runs in its own
process group with a timeout and is killed on every path. The speed worker runs alone on the first visible GPU
after the ranks have exited, with ``OMP_NUM_THREADS`` set (to this process's CPUs unless the caller set it) so that
torch's and DeepSpeed's OpenMP runtimes use the same threads.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from zeropilot.memory.profile import Profile, speed_fields
from zeropilot.errors import InputError
from zeropilot.runlog.layout import write_text_atomic
from zeropilot.safefile import check_output

WORKER_TIMEOUT_S = 240.0
#: the speed worker's limit: DeepSpeed's CPUAdam op is built on first use (about a minute on 2 cores, 2026-12)
SPEED_TIMEOUT_S = 600.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: List[str], env: Dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zeropilot.calibrate.worker", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _result(proc: subprocess.Popen, deadline: float, limit: float) -> dict:
    try:
        out, err = proc.communicate(timeout=max(deadline - time.time(), 1.0))
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise InputError(f"calibrate: a worker did not finish within {limit:.0f} s") from None
    lines = [x[10:] for x in out.splitlines() if x.startswith("CALIBRATE ")]
    if proc.returncode != 0 or not lines:
        tail = (err or out).strip().splitlines()[-3:]
        raise InputError("calibrate: a worker failed: " + " | ".join(tail))
    return json.loads(lines[-1])


def run_workers(nproc: int, extra_env: Optional[Dict[str, str]] = None, args: Optional[List[str]] = None,
                limit: float = WORKER_TIMEOUT_S) -> List[dict]:
    """Start ``nproc`` ranks (one per visible GPU) and return each one's measurements (``limit`` seconds at most)."""
    port = _free_port()
    procs = []
    try:
        for rank in range(nproc):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       PYTHONUNBUFFERED="1", **(extra_env or {}))
            procs.append(_start(args or [], env))
        deadline = time.time() + limit
        return [_result(p, deadline, limit) for p in procs]
    finally:
        for p in procs:
            _kill(p)


def disk_write_speed(directory: Path, mib: int) -> float:
    """Bytes per second writing ``mib`` MiB to a temporary file in ``directory`` (fsync included)."""
    if not directory.is_dir():
        raise InputError("checkpoint directory does not exist" if not directory.exists() else
                         "checkpoint directory is not a folder", directory)
    block = os.urandom(1 << 20) * 8
    fd, tmp = tempfile.mkstemp(prefix=".zeropilot-calibrate-", dir=str(directory))
    try:
        t0 = time.perf_counter()
        with os.fdopen(fd, "wb") as f:
            left = mib << 20
            while left > 0:
                left -= f.write(block[:min(left, len(block))])
            f.flush()
            os.fsync(f.fileno())
        return (mib << 20) / max(time.perf_counter() - t0, 1e-9)
    except OSError as exc:
        raise InputError(f"cannot write a test file: {exc.strerror}", directory) from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def host_mem_bytes() -> Optional[int]:
    """MemTotal of /proc/meminfo, None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _allocator(vendor: str) -> dict:
    conf = "expandable_segments:True"
    env = {"PYTORCH_CUDA_ALLOC_CONF": conf, "PYTORCH_ALLOC_CONF": conf}
    if vendor == "rocm":
        env["PYTORCH_HIP_ALLOC_CONF"] = conf
    return run_workers(1, env, ["--allocator"])[0]


def cpu_count() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def measure_speed(cpu_adam: bool = True, adam_elems: Optional[int] = None) -> dict:
    """The speed worker's report (``speed`` and its ``unmeasured`` reasons), one process on the first GPU
    (``adam_elems``: the host optimizers' partition, None for one past this host's last-level cache)."""
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(cpu_count())}
    args = ["--speed"] + ([] if cpu_adam else ["--no-cpu-adam"]) + (
        [] if adam_elems is None else ["--adam-elems", str(adam_elems)])
    return run_workers(1, env, args, SPEED_TIMEOUT_S)[0]


def _network(ranks: List[dict], gpu: bool, unmeasured: Dict[str, str]) -> dict:
    """The profile's network fields from the ranks' timings (none with one rank)."""
    from zeropilot.calibrate.network import combine

    if len(ranks) < 2:
        return {}
    if not gpu:
        unmeasured["network"] = "gloo on CPU: not what NCCL reaches between GPUs"
    return {"network": combine([r.get("network") or {} for r in ranks]), "network_backend": "nccl" if gpu else "gloo"}


def calibrate(nproc: int, checkpoint_dir: Path, disk_mib: int = 1024, cpu_adam: bool = True,
              network_mib: int = 64, adam_elems: Optional[int] = None) -> Profile:
    """Measure this machine at world size ``nproc`` and return its profile (``cpu_adam``: time DeepSpeed's CPUAdam,
    whose op is built on first use; ``network_mib``: MiB per collective when several ranks time their links;
    ``adam_elems``: the host optimizers' partition, None for one past the last-level cache).

    Raises:
        InputError: bad arguments, a worker that fails or hangs, an unwritable checkpoint directory.
    """
    if nproc < 1 or nproc > 64:
        raise InputError(f"--nproc {nproc}: 1 to 64")
    if disk_mib < 1 or disk_mib > 65536:
        raise InputError(f"--disk-mib {disk_mib}: 1 to 65536")
    t0 = time.time()
    ranks = run_workers(nproc, args=["--network-mib", str(network_mib)])
    first = ranks[0]
    unmeasured = dict(first.get("unmeasured", {}))
    gpu = first["vendor"] != "cpu"
    phases: Dict[str, Optional[int]] = {}
    for name in ("context", "blas", "comm", "deepspeed"):
        vals = [r["phases"].get(name) for r in ranks if r["phases"].get(name) is not None]
        phases[name] = max(vals) if vals else None
    outside = phases["deepspeed"] if phases["deepspeed"] is not None else phases["comm"]
    alloc = _allocator(first["vendor"]) if gpu else {}
    if not gpu:
        unmeasured.update(outside_torch_bytes=unmeasured.get("gpu", "no GPU"),
                          expandable_segments="no GPU: the allocator was not exercised")
    elif alloc.get("expandable_segments") is None:
        unmeasured["expandable_segments"] = alloc.get("how", "not reported")
    fast = measure_speed(cpu_adam, adam_elems)
    unmeasured.update(fast.get("unmeasured", {}))
    disk = disk_write_speed(checkpoint_dir, disk_mib)
    return Profile(gpu_name=first.get("gpu_name"), vendor=first["vendor"], world_size=nproc,
                   gpu_total_bytes=first.get("gpu_total_bytes"), outside_torch_bytes=outside, phases=phases,
                   expandable_segments=alloc.get("expandable_segments"), segment_bytes=alloc.get("segment_bytes", {}),
                   disk_write_bytes_per_s=disk, disk_path=str(checkpoint_dir.resolve()),
                   host_mem_bytes=host_mem_bytes(), versions=first.get("versions", {}),
                   wall_s=round(time.time() - t0, 1), unmeasured=unmeasured,
                   speed=speed_fields(fast.get("speed"), "measured by the speed worker"),
                   **_network(ranks, gpu, unmeasured))


def write_profile(profile: Profile, path: Path) -> None:
    """Write ``profile`` to ``path`` atomically (its folder is created when missing).

    Raises:
        InputError: a folder, FIFO or device at ``path`` (never replaced), or the write failed.
    """
    check_output(path)
    try:
        write_text_atomic(path, json.dumps(profile.to_dict(), indent=2) + "\n")
    except OSError as exc:
        raise InputError(f"cannot write the profile: {exc.strerror}", path) from None
