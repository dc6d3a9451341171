"""A lost node: restart on the surviving node(s) from a universal checkpoint, with the samples per step kept.

A job across nodes whose watchdog names a node lost (hang class ``node_lost``: every rank of that node stopped
publishing heartbeats) cannot restart as it was: its rendezvous waits for every node. Two ways on:

- **shrink** (only with ``--heal-allow shrink``): the surviving nodes restart without the lost one.
  1. The world size falls from ``W`` to ``W'`` (the lost node's ranks gone). The samples per optimizer step
     (micro batch x gradient accumulation x data-parallel ranks) are kept: :func:`keep_samples` raises gradient
     accumulation (lowering the micro batch only when ``W x GA`` is not a multiple of ``W'``). The optimizer sees
     the same number of samples per step; which samples each rank draws changes with the world size.
  2. The newest complete checkpoint was saved on ``W`` ranks: DeepSpeed loads ZeRO optimizer partitions only on the
     world size that wrote them, so it is resumable **only through a universal conversion** at ``W'``.
     ``zeropilot ckpt universal`` (:func:`zeropilot.checkpoint.universal.convert`) writes it into the attempt's
     ``universal/`` folder; the run's own checkpoint folder is never written.
  3. The launch's files are copied and edited (:mod:`zeropilot.heal.patch`): ``gradient_accumulation_steps`` (and
     the micro batch if it changed), ``"checkpoint": {"load_universal": true}``; the ``torchrun`` command is
     rewritten for the survivors (:func:`rewrite_torchrun`: one node: ``--nnodes 1 --standalone``, a rendezvous of
     its own on a free port; more: ``--nnodes`` and ``--node_rank`` renumbered, the same rendezvous).
  4. The guard hands the universal folder to the launch's load: a Trainer's ``resume_from_checkpoint``, a raw loop's
     own ``engine.load_checkpoint(dir)`` (:func:`zeropilot.guard.resume.load_dir`); its ``load`` record says
     ``universal: true``.
- **wait** (shrinking not allowed, or not possible for this launch): the same launch restarts on every node and its
  rendezvous waits for the lost node to come back (its own ``zeropilot run --heal`` started again there), at most
  the rendezvous timeout of the launch (:func:`rendezvous_wait_s`: ``--rdzv-conf timeout=S``, else torchrun's
  default, :data:`TORCHRUN_RDZV_TIMEOUT_S`) or the watchdog's limit for a job whose ranks never started, the
  smaller (:func:`waiting`). If the node does not come back by then, the attempt fails before any rank starts and
  the healing stops there, saying so.

Only ``torchrun`` launches (one launcher per node, each under its own ``zeropilot run``) are shrunk; a launch that
starts every node from one command (``deepspeed --hostfile``) waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

LOST_CLASS = "node_lost"  # the watchdog's hang class (zeropilot.runner.watchdog)
ALLOW_WORD = "shrink"  # the --heal-allow word (zeropilot.heal.fixes.ALLOW_WORDS)
#: torchrun's rendezvous timeout when the launch sets none: static rendezvous (``--master_addr``):
#: torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py ``_default_timeout_seconds``; c10d
#: (``--rdzv-backend c10d``): dynamic_rendezvous.py ``join_timeout`` default; both 600 s in torch 2.x
TORCHRUN_RDZV_TIMEOUT_S = 600
#: torchrun's flags that place a node in the job's rendezvous (underscores; torchrun takes dashes too)
_RDZV_FLAGS = ("nnodes", "node_rank", "master_addr", "master_port", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
               "standalone", "rdzv_standalone")


@dataclass(frozen=True)
class Lost:
    """The node(s) a ``node_lost`` verdict names and the job they left."""

    nodes: List[int]  # node ranks lost
    ranks: List[int]  # global ranks lost
    world: int  # data-parallel ranks before
    nnodes: int  # nodes before
    node_rank: int  # this node's rank before

    @property
    def new_world(self) -> int:
        return self.world - len(self.ranks)

    @property
    def new_nnodes(self) -> int:
        return self.nnodes - len(self.nodes)

    @property
    def new_node_rank(self) -> int:
        """This node's rank among the survivors (node ranks renumbered in order)."""
        return sum(1 for n in range(self.node_rank) if n not in self.nodes)


def is_lost(failure: Any) -> bool:
    return getattr(failure, "kind", None) == "hang" and getattr(failure, "cls", None) == LOST_CLASS


# -- pure parts -----------------------------------------------------------------------------------------------

def keep_samples(micro: int, ga: int, world: int, new_world: int) -> Union[Tuple[int, int], str]:
    """``(micro', ga')`` with ``micro' x ga' x new_world == micro x ga x world``, the micro batch kept when it can be
    (else the largest smaller one that divides), or why no pair keeps the samples per step."""
    if min(micro, ga, world, new_world) < 1:
        return f"micro batch {micro}, gradient accumulation {ga}, world {world} -> {new_world}: not a batch to keep"
    total = micro * ga * world
    if total % new_world:
        return (f"{micro} x {ga} x {world} = {total} samples per step do not split over {new_world} ranks: no micro "
                "batch and gradient accumulation keep them")
    per_rank = total // new_world
    m = next(m for m in range(min(micro, per_rank), 0, -1) if per_rank % m == 0)
    return m, per_rank // m


def _norm(word: str) -> str:
    return word.lstrip("-").partition("=")[0].replace("-", "_")


def rewrite_torchrun(command: List[str], nnodes: int, node_rank: int) -> Union[List[str], str]:
    """The ``torchrun`` command for ``nnodes`` nodes, this node being ``node_rank``; or why it cannot be rewritten.

    One node: every rendezvous flag dropped, ``--nnodes 1 --standalone`` (torchrun's one-node rendezvous on a free
    port of localhost). More: ``--nnodes`` and ``--node_rank`` set, the rendezvous endpoint kept (the survivors
    still meet there; the node that served it is not the one lost, else the verdict is ``store_gone``)."""
    from zeropilot.launch.commands import interpret
    from zeropilot.launch.shell import Command

    lc = interpret(Command(list(command), Path("<command>"), 0))
    if lc is None or lc.launcher != "torchrun" or lc.program is None:
        return "not a torchrun launch: only torchrun's per-node launchers are restarted with fewer nodes"
    start = 1 if Path(command[0]).name == "torchrun" else 3
    end = lc.program_args_index - 1  # the program's index
    keep: List[str] = []
    i = start
    drop = _RDZV_FLAGS if nnodes == 1 else ("nnodes", "node_rank")
    while i < end:
        word = command[i]
        name = _norm(word)
        has_value = "=" not in word and name in lc.flags and lc.flags[name][0] is not None and \
            lc.flags[name][1] == i
        if name not in drop:
            keep += command[i:i + 1 + has_value]
        i += 1 + has_value
    new = ["--nnodes", "1", "--standalone"] if nnodes == 1 else ["--nnodes", str(nnodes), "--node_rank",
                                                                 str(node_rank)]
    return command[:start] + new + keep + command[end:]


def rendezvous_wait_s(command: List[str]) -> int:
    """How long the launch's torchrun waits for every node at its rendezvous: ``--rdzv-conf timeout=S`` or
    ``join_timeout=S``, else :data:`TORCHRUN_RDZV_TIMEOUT_S`."""
    from zeropilot.launch.commands import interpret
    from zeropilot.launch.shell import Command

    lc = interpret(Command(list(command), Path("<command>"), 0))
    conf = ((lc.flags.get("rdzv_conf") or (None,))[0] if lc is not None else None) or ""
    for item in conf.split(","):
        key, _, value = item.partition("=")
        if key.strip() in ("timeout", "join_timeout") and value.strip().isdigit():
            return int(value)
    return TORCHRUN_RDZV_TIMEOUT_S


def lost_of(verdict: Dict[str, Any], command: List[str], world: Optional[int]) -> Union[Lost, str]:
    """The lost node(s) from the attempt's verdict and its torchrun command (``--nnodes``, ``--node_rank``)."""
    from zeropilot.launch.commands import as_int, interpret
    from zeropilot.launch.shell import Command

    nodes = [n for n in verdict.get("nodes_lost") or [] if isinstance(n, int)]
    node = verdict.get("node") if isinstance(verdict.get("node"), dict) else {}
    if not nodes and isinstance(node.get("node_rank"), int):
        nodes = [node["node_rank"]]
    ranks = [r for r in verdict.get("ranks") or [] if isinstance(r, int)]
    lc = interpret(Command(list(command), Path("<command>"), 0))
    if lc is None or lc.launcher != "torchrun":
        return "not a torchrun launch: only torchrun's per-node launchers are restarted with fewer nodes"
    nnodes = as_int((lc.nnodes or "").rpartition(":")[2])
    node_rank = as_int((lc.flags.get("node_rank") or (None,))[0]) or 0
    if not nodes or not ranks or not nnodes or not world:
        return "the verdict or the command does not say which node was lost, or how many nodes and ranks there were"
    if len(nodes) >= nnodes or len(ranks) >= world:
        return "no node is left to restart on"
    return Lost(sorted(nodes), sorted(ranks), world, nnodes, node_rank)


def batch_of(setups: List[Dict[str, Any]]) -> Optional[Tuple[int, int, int]]:
    """``(micro batch, gradient accumulation, world size)`` the engine ran with, from the ranks' ``setup`` records."""
    for s in setups:
        t = s.get("train") if isinstance(s.get("train"), dict) else {}
        vals = (t.get("micro_batch"), t.get("grad_accum"), t.get("world_size"))
        if all(type(v) is int and v > 0 for v in vals):
            return vals  # type: ignore[return-value]
    return None


def refusal(allow: List[str], lost: Union[Lost, str]) -> Optional[str]:
    """Why the survivors do not restart smaller (they wait for the node instead), or None: shrinking is allowed
    (``--heal-allow shrink``) and the lost node and the command are known."""
    if ALLOW_WORD not in allow:
        return "shrinking is not allowed (--heal-allow shrink restarts on the surviving nodes)"
    return lost if isinstance(lost, str) else None


def waiting(lost: Union[Lost, str, None], command: List[str], why: str, hang_timeout_s: Optional[float] = None
            ) -> Dict[str, Any]:
    """``heal.json``'s ``node_wait`` of an attempt that restarts the same launch and waits for the lost node.

    The wait ends at the first of: torchrun's rendezvous timeout (:func:`rendezvous_wait_s`; torchrun then fails
    before any rank starts, which is not restarted) and the watchdog's limit for a job with no rank heartbeat yet
    (``max(--hang-timeout, STARTUP_GRACE_S)``; a hang, which the no-loop rule stops at its second time)."""
    from zeropilot.runner.watchdog import STARTUP_GRACE_S

    nodes = ", ".join(map(str, lost.nodes)) if isinstance(lost, Lost) else "?"
    rdzv = rendezvous_wait_s(command)
    watchdog = None if hang_timeout_s is None else int(max(hang_timeout_s, STARTUP_GRACE_S))
    seconds = rdzv if watchdog is None else min(rdzv, watchdog)
    limits = f"torchrun's rendezvous timeout {rdzv} s" + ("" if watchdog is None else
                                                          f", the watchdog's start-up limit {watchdog} s")
    return {"nodes": list(lost.nodes) if isinstance(lost, Lost) else None, "timeout_s": seconds, "why": why,
            "what": f"the same launch restarts and its rendezvous waits for node {nodes} at most {seconds} s "
                    f"({limits}); start that node's `zeropilot run --heal` again to rejoin. If it does not come "
                    "back, the attempt fails before any rank starts and the healing stops"}


# -- the shrink -----------------------------------------------------------------------------------------------

@dataclass
class Shrink:
    """What a shrink changes, for ``heal.json`` (``shrink``) and the next attempt."""

    lost: Lost
    before: Tuple[int, int, int]  # micro, GA, world
    after: Tuple[int, int, int]
    command: List[str]
    env: Dict[str, str]
    patch: Any  # heal.patch.Patch of the batch and load_universal settings
    checkpoint: Optional[Dict[str, Any]]  # {from, tag, step, world_size, to, verdict}

    def to_dict(self) -> Dict[str, Any]:
        (m, g, w), (m2, g2, w2) = self.before, self.after
        return {"nodes_lost": list(self.lost.nodes), "ranks_lost": list(self.lost.ranks),
                "nnodes": [self.lost.nnodes, self.lost.new_nnodes], "world_size": [w, w2],
                "micro_batch": [m, m2], "grad_accum": [g, g2], "samples_per_step": [m * g * w, m2 * g2 * w2],
                "checkpoint": self.checkpoint, "settings": list(self.patch.settings), "files": list(self.patch.files),
                "diff": self.patch.diff}


def plan(lost: Lost, batch: Optional[Tuple[int, int, int]], command: List[str], env: Dict[str, str], launch: Any,
         copies: Path) -> Union[Shrink, str]:
    """The shrunk launch (nothing written yet), or why this launch cannot be shrunk."""
    from zeropilot.heal import patch

    if batch is None:
        return "no rank recorded its micro batch, gradient accumulation and world size"
    if batch[2] != lost.world:
        return f"the engine ran on {batch[2]} data-parallel ranks, the job on {lost.world}: not plain data parallel"
    kept = keep_samples(batch[0], batch[1], lost.world, lost.new_world)
    if isinstance(kept, str):
        return kept
    if launch is None:
        return "zeropilot could not read the launch"
    change: Dict[str, Any] = {"grad_accum": kept[1], "load_universal": True}
    if kept[0] != batch[0]:
        change["micro_batch"] = kept[0]
    p = patch.apply(change, command, env, launch, copies)
    if isinstance(p, str):
        return p
    rewritten = rewrite_torchrun(p.command, lost.new_nnodes, lost.new_node_rank)
    if isinstance(rewritten, str):
        return rewritten
    return Shrink(lost, batch, (kept[0], kept[1], lost.new_world), rewritten, p.env, p, None)


def universal_checkpoint(saves: List[Dict[str, Any]], lost: Lost, out: Path) -> Dict[str, Any]:
    """The newest complete checkpoint saved on the old world, converted into ``out`` (``resume`` of heal.json, with
    ``universal``: the conversion and the verdict). ``chosen`` is None when there is none or it failed."""
    from zeropilot.heal import checkpoints

    as_is = checkpoints.choose(saves, lost.new_world)  # the newest, judged as it is at the smaller world
    whole = checkpoints.choose(saves, None)  # the newest complete one, whatever its world size
    c = whole.chosen
    out_doc: Dict[str, Any] = dict(as_is.to_dict())
    if c is None:
        out_doc.update(chosen=None, universal=None)
        return out_doc
    if c.universal:
        out_doc.update(chosen=c.to_dict(), universal={"from": str(c.path), "tag": c.tag, "to": str(c.path),
                                                       "verdict": "already universal: resumable on any world size"})
        return out_doc
    verdict = (f"saved on {c.world_size} data-parallel ranks; the restart runs on {lost.new_world}: resumable only "
               f"through a universal conversion at {lost.new_world} ranks")
    folder = c.path
    try:
        result = _convert(folder, None if c.framework == "hf" else c.tag, out)
    except Exception as exc:  # noqa: BLE001  (an input error or a damaged checkpoint: said, no restart from it)
        render = getattr(exc, "render", None)
        out_doc.update(chosen=None, universal={"from": str(folder), "tag": c.tag, "to": str(out), "verdict": verdict,
                                               "error": render() if callable(render) else f"{type(exc).__name__}: "
                                                                                          f"{exc}"[:500]})
        return out_doc
    chosen = dict(c.to_dict(), path=str(out), universal=True, world_size=None)
    out_doc.update(chosen=chosen, skipped=[s for s in out_doc["skipped"] if s.get("step") != c.step],
                   universal={"from": str(folder), "tag": c.tag, "to": str(out), "verdict": verdict,
                              "parameters": result.parameters, "files": result.files, "bytes": result.bytes})
    return out_doc


def _convert(folder: Path, tag: Optional[str], out: Path) -> Any:
    from zeropilot.checkpoint.universal import UniversalOptions, convert

    return convert(folder, out, UniversalOptions(tag=tag, progress=False))


def says(s: Shrink) -> str:
    (m, g, w), (m2, g2, w2) = s.before, s.after
    return (f"node {', '.join(map(str, s.lost.nodes))} lost (ranks {', '.join(map(str, s.lost.ranks))}): restarting "
            f"on {s.lost.new_nnodes} node(s), {w2} ranks; micro batch {m} -> {m2}, gradient accumulation {g} -> {g2}: "
            f"{m}x{g}x{w} = {m2}x{g2}x{w2} = {m * g * w} samples per step")


def decide(allow: List[str], verdict: Dict[str, Any], setups: List[Dict[str, Any]], last: Dict[str, Any],
           attempt_dir: Path, read_launch: Callable[[], Any], read_saves: Callable[[], List[Dict[str, Any]]],
           hang_timeout_s: Optional[float] = None) -> Tuple[Optional[Shrink], Dict[str, Any]]:
    """The restart after a lost node: ``(Shrink, resume)`` with the copies and the universal conversion written, or
    ``(None, node_wait)`` (:func:`waiting`) when the survivors wait for the node.

    Args:
        allow: the ``--heal-allow`` words.
        verdict: the failed attempt's hang verdict (``nodes_lost``, ``ranks``).
        setups: its ranks' ``setup`` records (the batch the engine ran with).
        last: its ``heal.json`` entry (``command``, ``env``, ``world_size``).
        attempt_dir: the next attempt's run directory (copies in ``launch/``, the conversion in ``universal/``).
        read_launch: the failed attempt's launch as ``check`` reads it (called only when shrinking).
        read_saves: every attempt's ``save`` records (called only when shrinking).
        hang_timeout_s: the watchdog's ``--hang-timeout`` (bounds the wait, :func:`waiting`).
    """
    from zeropilot.runlog.layout import RunDir

    batch = batch_of(setups)
    lost = lost_of(verdict, last["command"], last.get("world_size") if batch is None else batch[2])
    why = refusal(allow, lost)
    where = RunDir(attempt_dir)
    s: Union[Shrink, str, None] = None
    if why is None:
        s = plan(lost, batch, last["command"], last["env"], read_launch(), where.launch_copies)
        why = s if isinstance(s, str) else None
    if why is None:
        where.root.mkdir(parents=True, exist_ok=True)
        resume = universal_checkpoint(read_saves(), lost, where.universal)
        s.checkpoint = resume.get("universal")
        if resume["chosen"] is None:
            why = "no complete checkpoint converted to a universal one: " + str(
                (resume.get("universal") or {}).get("error") or "the job saved none")
    if why is not None:
        return None, waiting(lost, last["command"], why, hang_timeout_s)
    s.patch.write()
    resume.update(give=resume["chosen"]["path"], how="the guard hands the universal checkpoint to the launch's load "
                  "(a Trainer's resume_from_checkpoint, a raw loop's own load_checkpoint(dir)), with \"checkpoint\": "
                  "{\"load_universal\": true} in the config copy")
    return s, resume


def shrunk(in_force: List[Dict[str, Any]]) -> bool:
    """Whether an earlier attempt of this heal run restarted on fewer nodes (its launch has ``load_universal``)."""
    return any(isinstance(f, dict) and f.get("key") == "shrink" for f in in_force or [])


def resume_after(attempts: List[Dict[str, Any]], choice: Any, resume: Dict[str, Any], command: List[str],
                 env: Dict[str, str], copies: Path, read_launch: Callable[[], Any]
                 ) -> Tuple[List[str], Dict[str, str], Dict[str, Any]]:
    """A restart after a shrunk attempt: ``(command, env, resume)``.

    The launch in force loads universal checkpoints. When no complete save newer than the universal conversion was
    made (``choice``: the checkpoints of the save folders, judged at the smaller world), the restart resumes from the
    conversion again (the guard hands it over). When there is one (a ZeRO save at the smaller world, which DeepSpeed
    reads only without ``load_universal``), ``load_universal`` is turned off on a new copy and ``resume`` is kept."""
    from zeropilot.heal import patch

    last = next((a for a in reversed(attempts) if a.get("shrink")), None)
    universal = ((last or {}).get("resume") or {}).get("chosen")
    if not universal:
        return command, env, resume
    newer = choice.chosen is not None and (choice.chosen.step or 0) > (universal.get("step") or 0)
    if newer and choice.chosen.universal:
        return command, env, resume
    if newer:
        launch = read_launch()
        p = patch.apply({"load_universal": False}, command, env, launch, copies) if launch is not None else None
        if isinstance(p, patch.Patch):
            p.write()
            return p.command, p.env, dict(resume, how=resume.get("how", "") + "; load_universal turned off on a copy: "
                                          "this save was made at the smaller world size")
    return command, env, dict(resume, chosen=universal, give=universal.get("path"),
                              how="the universal conversion of the restart on fewer nodes, again (no newer complete "
                                  "save): the guard hands it to the launch's load")
