"""Where a process of a job runs: its node and its place in the job, from the launchers' environment.

The one place that knows which variable each launcher sets (pure functions over a mapping: no torch, no
I/O). Every rank's ``start`` record carries :func:`rank_place` (``guard.rank``), ``zeropilot run`` records
:func:`node_env` in ``run.json``, and ``report`` groups ranks into nodes with :func:`node_key`.

What each launcher sets in a rank's environment (read from the installed sources):

- ``torchrun`` (``torch/distributed/elastic/agent/server/local_elastic_agent.py``, static and ``c10d``
  rendezvous alike): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node's
  rank: under ``c10d`` rendezvous the order nodes joined in, not ``--node_rank``), ``GROUP_WORLD_SIZE``,
  ``ROLE_RANK``, ``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``, ``MASTER_ADDR``/``MASTER_PORT``.
  ``accelerate launch`` and LLaMA-Factory's ``FORCE_TORCHRUN`` start torchrun, so their ranks carry the same;
  accelerate adds ``ACCELERATE_MIXED_PRECISION``, LLaMA-Factory's ranks inherit ``NNODES``/``NODE_RANK``.
- DeepSpeed's per-node launcher (``deepspeed/launcher/launch.py``, started on every node by the ``deepspeed``
  runner, through pdsh with a hostfile): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_SIZE``, ``CROSS_RANK``
  (the node's rank), ``CROSS_SIZE`` (nodes), ``MASTER_ADDR``/``MASTER_PORT``.
- Slurm's ``srun``: ``SLURM_PROCID`` (the task), ``SLURM_NODEID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``,
  ``SLURM_NNODES``, ``SLURM_JOB_NODELIST``, ``SLURM_JOB_ID``. Under ``srun torchrun`` (one torchrun per node)
  the ranks carry both; torchrun's variables win, Slurm's are kept under ``slurm``.
- Open MPI: ``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK``/``_LOCAL_SIZE``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional, Tuple

#: (field, variables in the order they are trusted)
_RANK = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
_WORLD = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
_LOCAL_RANK = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
_LOCAL_WORLD = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                "SLURM_NTASKS_PER_NODE")
_NODE_RANK = ("GROUP_RANK", "CROSS_RANK", "SLURM_NODEID", "NODE_RANK")
_NNODES = ("GROUP_WORLD_SIZE", "CROSS_SIZE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "NNODES")
_SLURM = ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NNODES",
          "SLURM_JOB_NODELIST", "SLURMD_NODENAME")
_MAX_TEXT = 256
_KEY = re.compile(r"[^A-Za-z0-9._-]")


def _int(value: Optional[str]) -> Optional[int]:
    """A non-negative int from an environment value; Slurm's ``2(x3)`` counts as 2; anything else None."""
    if value is None:
        return None
    m = re.match(r"\s*(\d{1,9})(?:\(x\d+\))?\s*$", str(value))
    return int(m.group(1)) if m else None


def _first(env: Mapping[str, str], names: Tuple[str, ...]) -> Tuple[Optional[int], Optional[str]]:
    for name in names:
        value = _int(env.get(name))
        if value is not None:
            return value, name
    return None, None


def _text(value: Optional[str]) -> Optional[str]:
    return None if value is None else str(value)[:_MAX_TEXT]


def launcher_of(env: Mapping[str, str]) -> Optional[str]:
    """The launcher that started a rank with this environment, by the variables only it sets.

    ``torchrun`` (also under ``accelerate launch`` and ``llamafactory-cli``, see :func:`started_by`),
    ``deepspeed`` (its per-node launcher), ``mpi``, ``srun`` (Slurm tasks with no other launcher's
    variables), ``env`` (``RANK`` set by something else, e.g. a script), or None.
    """
    if "TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env:
        return "torchrun"
    if "CROSS_RANK" in env and "LOCAL_SIZE" in env:
        return "deepspeed"
    if "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        return "mpi"
    if "RANK" in env:
        return "env"
    if "SLURM_PROCID" in env:
        return "srun"
    return None


def started_by(env: Mapping[str, str]) -> Optional[str]:
    """The tool above the launcher, where its variables show: ``accelerate`` or ``llamafactory``."""
    if "ACCELERATE_MIXED_PRECISION" in env:
        return "accelerate"
    if "FORCE_TORCHRUN" in env or "NPROC_PER_NODE" in env:
        return "llamafactory"
    return None


def rank_place(env: Mapping[str, str], hostname: str) -> Dict[str, Any]:
    """Where one rank runs: ``hostname``, ``node_rank`` (with ``node_rank_from``: the variable, or ``derived``
    from rank // local world size), ``local_rank``, ``rank``, ``local_world_size``, ``world_size``, ``nnodes``,
    ``launcher``, ``started_by``, ``run_id``, ``restart_count``, ``master_addr``, ``master_port``, ``slurm``
    (the ``SLURM_*`` values, or None outside Slurm). None where the environment does not tell."""
    launcher = launcher_of(env)
    rank, _ = _first(env, _RANK if launcher == "srun" else _RANK[:-1])
    world, _ = _first(env, _WORLD if launcher == "srun" else _WORLD[:-1])
    local_rank, _ = _first(env, _LOCAL_RANK if launcher == "srun" else _LOCAL_RANK[:-1])
    local_world, _ = _first(env, _LOCAL_WORLD)
    node_rank, node_from = _first(env, _NODE_RANK)
    nnodes, _ = _first(env, _NNODES)
    if node_rank is None and rank is not None and local_world:
        node_rank, node_from = rank // local_world, "derived"
    if nnodes is None and world and local_world and world % local_world == 0:
        nnodes = world // local_world
    slurm = {k: _text(env[k]) for k in _SLURM if k in env} or None
    return {"hostname": _text(hostname), "node_rank": node_rank, "node_rank_from": node_from,
            "local_rank": local_rank, "rank": rank, "local_world_size": local_world, "world_size": world,
            "nnodes": nnodes, "launcher": launcher, "started_by": started_by(env),
            "run_id": _text(env.get("TORCHELASTIC_RUN_ID")), "restart_count": _int(env.get("TORCHELASTIC_RESTART_COUNT")),
            "master_addr": _text(env.get("MASTER_ADDR")), "master_port": _int(env.get("MASTER_PORT")),
            "slurm": slurm}


def node_env(env: Mapping[str, str]) -> Dict[str, Any]:
    """What a node's environment says before any rank starts (``zeropilot run`` records it in ``run.json``):
    ``node_rank`` and ``nnodes`` (Slurm's, LLaMA-Factory's ``NODE_RANK``/``NNODES``), ``master_addr``,
    ``master_port``, ``slurm``; with the variable each came from under ``from``."""
    node_rank, node_from = _first(env, ("SLURM_NODEID", "NODE_RANK"))
    nnodes, nnodes_from = _first(env, ("SLURM_NNODES", "SLURM_JOB_NUM_NODES", "NNODES"))
    out: Dict[str, Any] = {"node_rank": node_rank, "nnodes": nnodes, "master_addr": _text(env.get("MASTER_ADDR")),
                           "master_port": _int(env.get("MASTER_PORT")),
                           "slurm": {k: _text(env[k]) for k in _SLURM if k in env} or None}
    out["from"] = {k: v for k, v in (("node_rank", node_from), ("nnodes", nnodes_from),
                                     ("master_addr", "MASTER_ADDR" if out["master_addr"] else None),
                                     ("master_port", "MASTER_PORT" if out["master_port"] is not None else None)) if v}
    return out


def node_key(place: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The node a rank belongs to, as a report groups ranks: ``node N`` by its node rank, else its hostname."""
    if not place:
        return None
    node_rank = place.get("node_rank")
    if isinstance(node_rank, int) and not isinstance(node_rank, bool):
        return f"node {node_rank}"
    host = place.get("hostname")
    return f"host {host}" if isinstance(host, str) and host else None


def file_key(node_rank: Optional[int], hostname: str, pid: int) -> str:
    """The part of ``run-node-<key>.json`` that names one node's supervisor file: its node rank, or
    ``<host>-<pid>`` when the launch does not say (``c10d`` rendezvous numbers nodes as they join)."""
    if node_rank is not None:
        return str(node_rank)
    return _KEY.sub("_", f"{hostname}-{pid}")[:96]
