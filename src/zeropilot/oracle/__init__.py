"""The libraries as oracles: the installed DeepSpeed, transformers and accelerate judge the launch's configs.

``zeropilot check --oracle`` (library: ``check(..., oracle=True)``) sends every DeepSpeed config of the launch,
with its training arguments (HF Trainer) or its accelerate settings and the launch's world size, to
:mod:`zeropilot.oracle.worker` in a subprocess, and maps each refusal to a finding (rules OR001-OR003) with the
file, key and line of the value refused. The pure-Python rules stay: they cover versions that are not installed
and what the libraries find only at ``deepspeed.initialize`` or later (no engine is built here).

Why on demand and not always (nor in parallel): the subprocess must import torch and the libraries, about 5 s on
the 2-core CI machine (``bench/check/detection/``), while ``check`` starts in under 0.3 s. Started in parallel
it would still hold ``check``'s answer for those seconds (the findings are the answer) and spend that CPU on every
run, editor saves included. So it runs when asked, with a time limit (``timeout_s``, default 120 s); a worker that
fails or times out yields one warning (OR000), never a traceback.

API::

    from zeropilot.oracle import ask, ask_many
    report = ask(launch)          # OracleReport: verdicts per DeepSpeed config, versions, seconds
    reports = ask_many(launches)  # one worker for several launches (benchmarks, corpora)
    report.verdicts[doc_id]       # list of Refusal (library, message, key, line)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from zeropilot.launch.document import Document, Node
from zeropilot.launch.facts import facts
from zeropilot.oracle.worker import MODEL_SECTIONS

DEFAULT_TIMEOUT_S = 120.0
@dataclass
class Refusal:
    """One refusal by an installed library, placed on the value it refused when that can be told."""

    library: str
    stage: str
    message: str
    node: Optional[Node] = None
    key: Optional[str] = None


@dataclass
class OracleReport:
    """What the oracle answered for a launch.

    Attributes:
        verdicts: ``id(document)`` -> refusals of that DeepSpeed config (empty: accepted).
        versions: the library versions that judged.
        seconds: wall time of the subprocess (``import_s`` of it importing the libraries).
        failure: why the oracle gave no answer (timeout, crash), else None.
    """

    verdicts: Dict[int, List[Refusal]] = field(default_factory=dict)
    versions: Dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    import_s: float = 0.0
    failure: Optional[str] = None


def _train_args(launch, ds: Document) -> Optional[Dict[str, Any]]:
    for train, linked in facts(launch).hf_pairs:
        if linked is ds and train.flavour in ("hf", "llamafactory", None):
            plain = train.root.plain()
            return plain if isinstance(plain, dict) else {}
    return None


def _mixed_precision(launch, ds: Document) -> Optional[str]:
    for acc in launch.accelerate_configs:
        if launch.ds_config_for(acc) is ds and isinstance(acc.value("mixed_precision"), str):
            return acc.value("mixed_precision")
    for lc in launch.commands:
        flag = lc.flags.get("mixed_precision") if lc.launcher == "accelerate" else None
        if flag and flag[0]:
            return flag[0]
    return None


def cases(launch) -> List[Dict[str, Any]]:
    """The worker's request: one case per DeepSpeed config that parsed as a mapping."""
    out = []
    accelerate_docs = {id(launch.ds_config_for(a)) for a in launch.accelerate_configs}
    for f in facts(launch).ds:
        config = f.doc.root.plain()
        if not isinstance(config, dict):
            continue
        out.append({"id": str(id(f.doc)), "config": config, "world_size": launch.world_size.value,
                    "train_args": _train_args(launch, f.doc),
                    "accelerate": id(f.doc) in accelerate_docs or any(lc.launcher == "accelerate"
                                                                      for lc in launch.commands),
                    "mixed_precision": _mixed_precision(launch, f.doc)})
    return out


def _run_worker(request: Dict[str, Any], timeout_s: float) -> Dict[str, Any]:
    """Run the worker in its own process group (killed on every path); its answer, or ``{"failure": why}``."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "zeropilot.oracle.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(json.dumps(request, default=str), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"failure": f"the oracle did not answer within {timeout_s:.0f} s"}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    for line in reversed(out.splitlines()):
        if line.startswith("ORACLE-ANSWER "):
            try:
                return json.loads(line[len("ORACLE-ANSWER "):])
            except ValueError:
                return {"failure": "the oracle worker's answer was cut short"}
    tail = (err or out).strip().splitlines()[-1:] or ["no output"]
    return {"failure": f"the oracle worker exited {proc.returncode}: {tail[0][:300]}"}


def ask(launch, timeout_s: float = DEFAULT_TIMEOUT_S) -> OracleReport:
    """Ask the installed libraries about every DeepSpeed config of the launch."""
    return ask_many([launch], timeout_s)[0]


def ask_many(launches: List[Any], timeout_s: float = DEFAULT_TIMEOUT_S) -> List[OracleReport]:
    """One worker (the libraries imported once) for several launches; a report per launch, in order."""
    request = {"cases": [dict(c, id=f"{i}:{c['id']}") for i, launch in enumerate(launches) for c in cases(launch)]}
    reports = [OracleReport() for _ in launches]
    if not request["cases"]:
        return reports
    started = time.perf_counter()
    answer = _run_worker(request, timeout_s)
    seconds = round(time.perf_counter() - started, 3)
    for i, (launch, report) in enumerate(zip(launches, reports)):
        report.seconds = seconds
        if "failure" in answer:
            report.failure = answer["failure"]
            continue
        report.versions, report.import_s = answer.get("versions", {}), answer.get("import_s", 0.0)
        docs = {f"{i}:{id(f.doc)}": f.doc for f in facts(launch).ds}
        for doc_id, errors in answer.get("results", {}).items():
            doc = docs.get(doc_id)
            if doc is not None:
                report.verdicts[id(doc)] = [r for e in errors for r in refusals(doc, e)]
    return reports


def refusals(doc: Document, error: Dict[str, Any]) -> List[Refusal]:
    """One worker error as refusals, each placed on the node it names (pydantic locations, key names)."""
    library, stage = error.get("library", "?"), error.get("stage", "?")
    if error.get("errors"):
        out = []
        for e in error["errors"]:
            node, key = _node_for_loc(doc, error.get("model"), e.get("loc", []))
            if not e.get("loc"):  # a model validator: the message names the field
                inner, inner_key = _node_in_message(doc, e.get("msg", ""))
                if inner is not None and (key is None or inner_key.startswith(key)):
                    node, key = inner, inner_key
            out.append(Refusal(library, stage, f"{error['type']}: {e.get('msg', '')}", node, key))
        return out
    message = f"{error.get('type')}: {error.get('message', '')}"
    mismatches = re.findall(r"^- ds (\S+)=(.*?) vs hf (.*)$", error.get("message", ""), flags=re.M)
    if mismatches:
        return [Refusal(library, stage, f"transformers: the config's {k}={v} contradicts the training arguments' "
                                        f"{hf}", doc.get(k), k) for k, v, hf in mismatches]
    node, key = _node_in_message(doc, error.get("message", ""))
    return [Refusal(library, stage, message, node, key)]


def _node_for_loc(doc: Document, model: Optional[str], loc: List[str]):
    section = MODEL_SECTIONS.get(model or "")
    prefixes = ([section] if section else []) + ["", "zero_optimization", "fp16", "bf16"]
    for prefix in prefixes:
        key = ".".join(p for p in [prefix] + list(loc) if p)
        while key:
            node = doc.get(key)
            if node is not None:
                return node, key
            key = key.rpartition(".")[0]  # a location inside a value (list index, union member)
    return (doc.get(section), section) if section else (None, None)


def _node_in_message(doc: Document, message: str):
    """The config key a plain error message names (longest key path whose last part appears as a word)."""
    best = None
    for node in doc.root.walk():
        path = node.path
        if not path:
            continue
        last = path.rpartition(".")[2]
        if len(last) > 3 and re.search(rf"(?<![A-Za-z0-9_]){re.escape(last)}(?![A-Za-z0-9_])", message):
            if best is None or len(last) > len(best[0].rpartition(".")[2]):
                best = (path, node)
    return (best[1], best[0]) if best else (None, None)
