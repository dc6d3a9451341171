"""Jobs across nodes, simulated on this machine, for the heal tests (tests/heal/test_heal_nodes.py): one ``zeropilot
run`` per node, each starting ``torchrun --nnodes N --node_rank K`` with the same ``--master_addr 127.0.0.1
--master_port P`` (CPU, gloo), each with its own run directory; things done to one node while they run (a signal, a
freeze); every process ends on every path."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from tests import runjobs
from tests.guard.test_watch_nodes import _signal_all, _tree

TIMEOUT_S = 240.0


def torchrun(nnodes: int, node: int, port: int, nproc: int, script: List[str]) -> List[str]:
    return ["torchrun", "--nnodes", str(nnodes), "--nproc_per_node", str(nproc), "--node_rank", str(node),
            "--master_addr", "127.0.0.1", "--master_port", str(port), *script]


class Node:
    """One node's ``zeropilot run --out OUT FLAGS -- COMMAND``, in its own session."""

    def __init__(self, name: str, out: Path, flags: List[str], command: List[str]) -> None:
        self.out, self.command = out, command
        argv = [sys.executable, "-m", "zeropilot", "run", "--out", str(out), *flags, "--", *command]
        self.proc = subprocess.Popen(argv, cwd=str(runjobs.REPO), env=runjobs.job_env(name), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.log = ""

    def wait(self, deadline: float) -> int:
        try:
            self.log = self.proc.communicate(timeout=max(deadline - time.time(), 1))[0]
        except subprocess.TimeoutExpired:
            self.kill()
            self.log = self.proc.communicate()[0]
            raise AssertionError(f"{self.out}: did not end in time\n{self.log[-4000:]}") from None
        finally:
            with open(self.out.parent / f"{self.out.name}.log", "a") as fh:  # every run of this node, kept
                fh.write(self.log)
        return self.proc.returncode

    def kill(self) -> None:
        _signal_all(_tree(self.proc.pid), signal.SIGKILL)

    def heal(self) -> Dict:
        return json.loads((self.out / "heal.json").read_text())


def records(folder: Path, event: str) -> List[Dict]:
    out: List[Dict] = []
    for f in sorted(folder.glob("rank-*.jsonl")):
        out += [r for r in map(json.loads, f.read_text().splitlines()) if r.get("event") == event]
    return out


def until(test: Callable[[], bool], deadline: float, what: str, nodes: List[Node]) -> None:
    while not test():
        if time.time() > deadline or all(n.proc.poll() is not None for n in nodes):
            raise AssertionError(f"never: {what}\n" + "\n".join(n.log or "" for n in nodes)[-4000:])
        time.sleep(0.2)


def run_nodes(name: str, commands: List[List[str]], flags: List[str], outs: List[Path],
              during: Optional[Callable[[List[Node], float], None]] = None) -> List[Node]:
    """Every node's ``zeropilot run``; ``during(nodes, deadline)`` runs while they do; all waited for."""
    nodes: List[Node] = []
    try:
        nodes = [Node(name, outs[k], flags, commands[k]) for k in range(len(commands))]
        deadline = time.time() + TIMEOUT_S
        if during is not None:
            during(nodes, deadline)
        for n in nodes:
            n.wait(deadline)
    finally:
        for n in nodes:
            n.kill()
            n.proc.wait()
    return nodes
