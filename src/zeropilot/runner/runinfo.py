"""What ``run.json`` says about a launch before it starts: versions, environment, check, plan.

``check`` and ``plan`` see the launch the way ``zeropilot check`` does: the command is written as a
one-line launch script (``launch.sh`` in the run directory) and read with the files it names,
relative to the working directory.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.runlog.layout import RUN_SCHEMA

_ENV_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUDA_VISIBLE_DEVICES",
              "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "DEEPSPEED_TIMEOUT", "DS_ACCELERATOR",
              "TORCH_EXTENSIONS_DIR", "OMP_NUM_THREADS", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "FORCE_TORCHRUN", "NPROC_PER_NODE", "NNODES", "NODE_RANK", "GLOO_SOCKET_IFNAME")
_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_FR_", "RCCL_")


def environment(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The variables that change memory, devices and timeouts (no secrets: only these names)."""
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in sorted(env.items()) if k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)}


_PACKAGES = ("torch", "deepspeed", "transformers", "accelerate", "peft", "llamafactory", "trl", "zeropilot",
             "flash-attn", "bitsandbytes", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "triton", "pytorch-triton-rocm")


def versions() -> Dict[str, str]:
    """Versions of the packages that change what a ZeRO launch does, and Python's."""
    import platform

    from zeropilot.launch.versions import installed_versions

    try:
        found = dict(installed_versions())
    except Exception:  # noqa: BLE001
        found = {}
    out = {k: v for k, v in found.items() if k in _PACKAGES}
    out["python"] = platform.python_version()
    return out


def write_launch_script(command: List[str], path: Path, env: Optional[Dict[str, str]] = None) -> Path:
    """The launch as a shell script that ``check`` can read: the variables of :func:`environment` that are set
    (``NPROC_PER_NODE`` and ``FORCE_TORCHRUN`` for ``llamafactory-cli``, visible devices, allocator settings:
    the launch's own environment, which decides its world size and what the rules see), then the command."""
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in environment(env).items())
    path.write_text("#!/bin/sh\n# written by zeropilot run: the launch it watches, with the environment it ran in\n"
                    + exports + shlex.join(command) + "\n", encoding="utf-8")
    return path


def run_check(command: List[str], script: Path) -> Tuple[Dict[str, Any], Any, List[str]]:
    """``check`` on the launch: summary for run.json, the launch, and the error lines to print."""
    from zeropilot.check import check
    from zeropilot.rules.registry import Severity

    result, launch = check([script])
    errors = [f for f in result.findings if f.severity == Severity.ERROR]
    summary = {"errors": len(errors), "warnings": result.count(Severity.WARNING),
               "codes": sorted({f.code for f in result.findings}),
               "files": [f for f in result.files if Path(f) != script]}
    lines = [f"{f.code} {f.message}" for f in errors]
    return summary, launch, lines


def make_plan(launch: Any) -> Optional[Dict[str, Any]]:
    """The plan of the launch where its model can be sized here without the network, else None + reason."""
    try:
        from zeropilot.launch.planfacts import plan_facts
        from zeropilot.memory.from_launch import launch_inputs
        from zeropilot.memory.inputs import PlanInputs
        from zeropilot.memory.plan import make_plan as plan_of
        from zeropilot.memory.render import to_dict
        from zeropilot.models import resolve_model

        lv = plan_facts(launch)
        if not lv.model:
            return {"peak_bytes_per_rank": None, "reason": "the launch names no model (model_name_or_path)"}
        arch = resolve_model(lv.model, lv.model_base)  # no hub argument: no network
        given = launch_inputs(lv, arch.hidden)
        values = dict(given.values)
        if lv.world_size:
            values["world"] = lv.world_size
        values["flavour"] = lv.flavour
        plan = to_dict(plan_of(PlanInputs(arch=arch, hardware=None, sources=given.sources, **values)))
        plan["peak_bytes_per_rank"] = plan.get("gpu_peak_bytes")
        return plan
    except Exception as exc:  # noqa: BLE001 - a plan is optional; say why there is none
        return {"peak_bytes_per_rank": None, "reason": f"{exc.__class__.__name__}: {str(exc)[:300]}"}


#: launchers that run once per node, each node under its own ``zeropilot run`` (deepspeed with a hostfile and
#: ``srun`` start every node from one command, so one supervisor sees the whole job)
_PER_NODE = ("torchrun", "accelerate", "llamafactory")


def node_record(launch: Any, env: Optional[Dict[str, str]] = None) -> Optional[Dict[str, Any]]:
    """This node's place in a launch across nodes (``run.json`` ``node``), None for a one-node launch.

    The launch's own settings (``launch.multinode``: ``--nnodes``, ``--node_rank``, master address, rendezvous)
    win over the environment's (``runlog.nodes.node_env``: Slurm's, LLaMA-Factory's ``NODE_RANK``). ``per_node``
    is true when each node runs its own launcher (and its own ``zeropilot run``); ``file_key`` then names this
    node's files in a shared run directory (``run-node-<key>.json``).
    """
    import socket

    from zeropilot.runlog.nodes import file_key, node_env

    env = dict(os.environ if env is None else env)
    facts: Dict[str, Any] = {}
    if launch is not None:
        from zeropilot.launch.multinode import node_facts, summary

        facts = summary(node_facts(launch))
    place = node_env(env)
    sources = dict(place.pop("from"))
    for key, value in facts.items():
        if key != "from" and value is not None:
            place[key] = value
    sources.update(facts.get("from") or {})
    nnodes = place.get("nnodes") or place.get("scheduler_nodes") or 1
    if not isinstance(nnodes, int) or nnodes <= 1:
        return None
    host = socket.gethostname()
    place.update(hostname=host, nnodes=nnodes, **{"from": sources})
    place["per_node"] = place.get("launcher") in _PER_NODE and not place.get("wrapper") or \
        (place.get("launcher") == "deepspeed" and "node_rank" in (facts.get("from") or {}))
    place["file_key"] = file_key(place.get("node_rank"), host, os.getpid()) if place["per_node"] else None
    return place


def run_record(command: List[str], check_summary: Optional[Dict[str, Any]], plan: Optional[Dict[str, Any]],
               world_size: Optional[int], hang_timeout_s: float, on_hang: str,
               node: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``run.json`` at start (``node``: :func:`node_record`, for a launch across nodes)."""
    return {"schema": RUN_SCHEMA, "command": list(command), "cwd": os.getcwd(), "started_at": time.time(),
            "world_size": world_size, "versions": versions(), "environment": environment(),
            "check": check_summary, "plan": plan, "hang_timeout_s": hang_timeout_s, "on_hang": on_hang,
            "node": node}
