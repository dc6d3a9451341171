"""The heal matrix on CPU: every launch x every fault under ``zeropilot run --heal``, against the same run that never
failed, bit for bit.

    python bench/heal/matrix.py OUT_JSON [--only hf_z2:kill ...] [--keep DIR]
    python bench/heal/matrix.py --table OUT_JSON        (the results as the Markdown table of the README)

Launches (2 ranks, gloo, ``DS_ACCELERATOR=cpu``; unmodified scripts from ``tests/guard/jobs``): ``hf_z2`` and
``hf_z3`` (``hf_train.py``: HF Trainer + DeepSpeed ZeRO-2 / ZeRO-3 under torchrun), ``raw_z3`` (``ds_resume.py``:
a raw ZeRO-3 loop under the ``deepspeed`` launcher that loads its own ``latest``). 8 optimizer steps, a save every 2.
Faults, each firing once: ``kill`` (rank 1 SIGKILLed after step 5), ``hang`` (rank 1 sleeps after step 5; the
watchdog, ``--hang-timeout 8``, stops the job), ``preempt`` (SIGTERM to ``zeropilot run`` once step 3 is recorded;
then the same ``zeropilot run --heal --out DIR`` again, as a requeued job would). Each cell records the heal outcome,
the attempts, the checkpoint resumed from, the steps redone against the save interval, and whether every tensor of
the final checkpoint (model and optimizer states of every rank) is bitwise equal to the reference's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "tests" / "guard" / "jobs"
STEPS, SAVE_EVERY, FAULT_STEP = 8, 2, 5
LAUNCHES = ("hf_z2", "hf_z3", "raw_z3")
FAULTS = ("kill", "hang", "preempt")
TIMEOUT_S = 600


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(work: Path) -> dict:
    e = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
             HF_HUB_OFFLINE="1", TORCH_EXTENSIONS_DIR=str(work / "torch_extensions"))
    e["PYTHONPATH"] = os.pathsep.join([str(JOBS / "site"), str(REPO / "src")] + [p for p in e.get("PYTHONPATH", "")
                                                                                   .split(os.pathsep) if p])
    return e


def command(launch: str, ckpt: Path, fault: str, marker: Path) -> list:
    """The launch, with the fault's flags (``none``: the reference)."""
    if launch.startswith("hf"):
        cmd = ["torchrun", "--nproc_per_node", "2", "--master_port", str(port()), str(JOBS / "hf_train.py"), str(ckpt),
               "--stage", launch[-1], "--steps", str(STEPS), "--save-steps", str(SAVE_EVERY)]
        kinds = {"kill": "kill-rank1", "hang": "hang-rank1"}
    else:
        cmd = ["deepspeed", "--num_gpus", "2", "--master_port", str(port()), str(JOBS / "ds_resume.py"),
               "--save-dir", str(ckpt), "--deepspeed_config", str(JOBS / "ds_config.json"), "--steps", str(STEPS),
               "--save-every", str(SAVE_EVERY)]
        kinds = {"kill": "kill", "hang": "hang"}
    if fault in kinds:
        cmd += ["--fault", kinds[fault], "--fault-step", str(FAULT_STEP), "--fault-once", str(marker)]
    if fault == "preempt":
        cmd += ["--step-sleep", "1.0"]  # a signal lands mid-run, and the stop step comes before the last step
    return cmd


def zeropilot(out: Path, cmd: list, flags: list, e: dict, signal_at_step=None) -> dict:
    argv = [sys.executable, "-m", "zeropilot", "run", "--no-check", "--out", str(out), *flags, "--", *cmd]
    t0 = time.time()
    log = open(out.parent / f"{out.name}.log", "a")
    proc = subprocess.Popen(argv, cwd=str(REPO), env=e, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if signal_at_step is not None:
            _signal_when(proc, out, signal_at_step)
        rc = proc.wait(timeout=TIMEOUT_S)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        log.close()
    return {"rc": rc, "seconds": round(time.time() - t0, 1)}


def _signal_when(proc, out: Path, step: int) -> None:
    """SIGTERM to ``zeropilot run`` once rank 0 recorded optimizer step ``step``."""
    deadline = time.time() + TIMEOUT_S
    while time.time() < deadline and proc.poll() is None:
        try:
            lines = (out / "rank-0.jsonl").read_text().splitlines()
        except OSError:
            lines = []
        if any('"event":"step"' in l and f'"step":{step},' in l for l in lines):
            proc.send_signal(signal.SIGTERM)
            return
        time.sleep(0.1)


def final_tag(launch: str, ckpt: Path) -> Path:
    return ckpt / f"checkpoint-{STEPS}" / f"global_step{STEPS}" if launch.startswith("hf") else \
        ckpt / f"global_step{STEPS}"


def compare(a: Path, b: Path) -> dict:
    """Every tensor of two tag folders' files: how many, and the first that differs."""
    import torch

    def tensors(folder):
        out = {}

        def walk(obj, key):
            if isinstance(obj, torch.Tensor):
                out[key] = obj
            elif isinstance(obj, dict):
                for k, v in obj.items():
                    walk(v, f"{key}.{k}")
            elif isinstance(obj, (list, tuple)):
                for i, v in enumerate(obj):
                    walk(v, f"{key}[{i}]")
        for f in sorted(folder.glob("*.pt")):
            walk(torch.load(f, map_location="cpu", weights_only=False), f.name)
        return out

    if not b.is_dir():
        return {"tensors": 0, "bitwise_equal": False, "first_difference": f"{b} missing"}
    ta, tb = tensors(a), tensors(b)
    diff = next((k for k in ta if k not in tb or ta[k].dtype != tb[k].dtype or not torch.equal(ta[k], tb[k])), None)
    same = diff is None and sorted(ta) == sorted(tb)
    return {"tensors": len(ta), "bitwise_equal": same, "first_difference": diff}


def cell(launch: str, fault: str, work: Path, ref_ckpt: Path) -> dict:
    base = work / f"{launch}-{fault}"
    base.mkdir(parents=True)
    e = env(work)
    cmd = command(launch, base / "ckpt", fault, base / "fired")
    flags = ["--heal", "--heal-backoff", "1", "--hang-timeout", "8"]
    runs = [zeropilot(base / "run", cmd, flags, e, signal_at_step=3 if fault == "preempt" else None)]
    if fault == "preempt":
        runs.append(zeropilot(base / "run", cmd, flags, e))  # the requeued job: the same command, the same DIR
    heal = json.loads((base / "run" / "heal.json").read_text())
    attempts = heal["attempts"]
    resumed = [a for a in attempts if a.get("resume")]
    chosen = [(a["resume"].get("chosen") or {}).get("step") for a in resumed]
    redone = [a.get("steps_redone") for a in resumed]
    row = {"launch": launch, "fault": fault, "status": heal["outcome"]["status"], "exit_codes": [r["rc"] for r in runs],
           "seconds": round(sum(r["seconds"] for r in runs), 1), "attempts": len(attempts),
           "failures": [(a.get("failure") or {}).get("kind") for a in attempts],
           "resumed_from_steps": chosen, "resumed_really": [(a.get("resumed") or {}).get("really") for a in resumed],
           "steps_redone": redone, "save_interval": SAVE_EVERY,
           "redone_within_interval": all(r is not None and r <= SAVE_EVERY for r in redone)}
    if fault == "preempt":
        run = json.loads((base / "run" / "run.json").read_text())
        row["preempted"] = run.get("preempted")
    row.update(compare(final_tag(launch, ref_ckpt), final_tag(launch, base / "ckpt")))
    return row


def table(doc: dict) -> str:
    """The results as a Markdown table."""
    lines = ["| launch | fault | outcome | attempts | resumed from step | steps redone (save every "
             f"{doc['save_every']}) | final checkpoint vs the run that never failed | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        same = (f"bitwise equal ({r['tensors']} tensors)" if r["bitwise_equal"] else
                f"DIFFERS: {r['first_difference']}")
        lines.append(f"| {r['launch']} | {r['fault']} | {r['status']} | {r['attempts']} | "
                     f"{', '.join(map(str, r['resumed_from_steps']))} | {', '.join(map(str, r['steps_redone']))} | "
                     f"{same} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    if sys.argv[1:2] == ["--table"]:
        print(table(json.loads(Path(sys.argv[2]).read_text())), end="")
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--only", nargs="*", default=[], help="cells as launch:fault")
    p.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one, removed)")
    a = p.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="zp-heal-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    cells = [(l, f) for l in LAUNCHES for f in FAULTS if not a.only or f"{l}:{f}" in a.only]
    rows, refs = [], {}
    try:
        for launch, fault in cells:
            if launch not in refs:
                ref = work / f"{launch}-reference"
                ref.mkdir(parents=True, exist_ok=True)
                r = zeropilot(ref / "run", command(launch, ref / "ckpt", "none", ref / "x"), [], env(work))
                refs[launch] = ref / "ckpt"
                print(f"reference {launch}: exit {r['rc']} in {r['seconds']} s", flush=True)
            row = cell(launch, fault, work, refs[launch])
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    import platform

    import torch

    doc = {"steps": STEPS, "save_every": SAVE_EVERY, "fault_step": FAULT_STEP, "host": platform.node(),
           "cpus": os.cpu_count(), "load_average": os.getloadavg(), "torch": torch.__version__, "rows": rows}
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if all(r["status"] == "healed" and r["bitwise_equal"] and r["redone_within_interval"] for r in rows) \
        else 1


if __name__ == "__main__":
    sys.exit(main())
