"""Detection of ``zeropilot check`` on test cases from DeepSpeed's, transformers' and accelerate's test suites.

Command (2-core CPU machine, about 2 minutes)::

    DS_ACCELERATOR=cpu python bench/check/detection/run.py

1. Re-verifies every case (``cases.py``) on the installed libraries, in one child process (one rank, gloo):
   ``DeepSpeedConfig`` (world size from an mpu), ``TrainingArguments(deepspeed=...)`` then the Trainer's
   ``trainer_config_finalize`` and ``DeepSpeedConfig``, accelerate's ``Accelerator()`` / ``prepare()``, and
   ``deepspeed.initialize`` with the script's pattern. The installed verdict is the truth used for scoring;
   where it differs from what the upstream test expects, the case is listed.
2. Writes each case as a launch folder (the DeepSpeed JSON, training YAML, accelerate YAML, script, launch line)
   and runs ``check`` on it with the installed versions: once with the rules alone, once with the oracle
   (``ask_many``: one worker for all cases). A case counts as caught when check reports at least one error.
3. Writes ``results.json`` and ``results.md`` beside this file.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))
from cases import cases  # noqa: E402


# ---- 1. the libraries' verdicts (child process) -------------------------------------------------------------------

def _verify_ds(case, work: Path) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    if case["config"] is None:
        path = work / f"{case['name']}.json"
        path.write_text(case["text"])
        DeepSpeedConfig(str(path))
    else:
        world = case["world"]
        DeepSpeedConfig(json.loads(json.dumps(case["config"])),
                        mpu=SimpleNamespace(get_data_parallel_world_size=lambda: world))


def _verify_hf(case, work: Path) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(work / "out"), use_cpu=True, report_to="none",
                             deepspeed=json.loads(json.dumps(case["config"])),
                             **{k: v for k, v in case["train"].items() if k != "output_dir"})
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=64))
    args.hf_deepspeed_config.trainer_config_finalize(args, model, 100)
    DeepSpeedConfig(args.hf_deepspeed_config.config, mpu=SimpleNamespace(get_data_parallel_world_size=lambda: 1))


def _accelerator(case, work: Path):
    from accelerate import Accelerator

    path = work / f"{case['name']}.json"
    path.write_text(json.dumps(case["config"]))
    os.environ.update(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_CONFIG_FILE=str(path),
                      ACCELERATE_MIXED_PRECISION=case.get("mixed_precision") or "no")
    return Accelerator()


def _verify_acc(case, work: Path) -> None:
    from accelerate.state import AcceleratorState

    try:
        acc = _accelerator(case, work)
        if case["verify"] == "acc_prepare":
            import torch
            from accelerate.utils import DummyOptim
            from torch.utils.data import DataLoader, TensorDataset

            model = torch.nn.Linear(2, 2)
            opt = torch.optim.AdamW(model.parameters()) if case["optimizer"] == "real" else \
                DummyOptim(model.parameters())
            data = DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=16)
            acc.prepare(model, opt, data)
    finally:
        AcceleratorState._reset_state(True)


def _verify_init(case, work: Path) -> None:
    import deepspeed
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=dict(case["config"]))
    with engine.no_sync():
        for _ in range(2):
            engine.backward(engine(torch.randn(1, 8)).sum())
            if case.get("action") == "step_in_no_sync":
                engine.step()


VERIFY = {"ds": _verify_ds, "hf": _verify_hf, "acc_plugin": _verify_acc, "acc_prepare": _verify_acc,
          "init": _verify_init}


def verify_child(out_path: str) -> None:
    """Run in a fresh process: every case through the real library; name -> "ok" or "Type: message"."""
    os.environ.update(DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1")
    import deepspeed

    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # gloo does the same collectives
    deepspeed.init_distributed(dist_backend="gloo")
    work = Path(tempfile.mkdtemp(prefix="zp-detect-verify-"))
    out = {}
    for case in cases():
        try:
            VERIFY[case["verify"]](case, work)
            out[case["name"]] = "ok"
        except Exception as exc:  # the refusal is the verdict
            out[case["name"]] = f"{type(exc).__name__}: {str(exc)[:300]}"
    Path(out_path).write_text(json.dumps(out, indent=1))


def verify_all(work: Path) -> Dict[str, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = work / "verdicts.json"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_PORT": str(port),
           "TORCH_EXTENSIONS_DIR": str(work / "torch_extensions")}
    proc = subprocess.Popen([sys.executable, __file__, "--verify", str(out)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    if not out.exists():
        raise SystemExit(f"verification failed:\n{log[-4000:]}")
    return json.loads(out.read_text())


# ---- 2. check on the same files -----------------------------------------------------------------------------------

PREPARE = ("import torch\nfrom accelerate import Accelerator\nfrom accelerate.utils import DummyOptim\n"
           "acc = Accelerator()\nmodel = torch.nn.Linear(2, 2)\nopt = {opt}\nmodel, opt, data = acc.prepare(model, "
           "opt, data)\n")


def write_launch(case, root: Path) -> Path:
    folder = root / case["name"]
    folder.mkdir(parents=True)
    (folder / "ds.json").write_text(case["text"] if case["config"] is None else json.dumps(case["config"], indent=2))
    if case.get("train"):
        lines = [f"{k}: {json.dumps(v)}" for k, v in case["train"].items()] + ["deepspeed: ds.json"]
        (folder / "train.yaml").write_text("\n".join(lines) + "\n")
    if case.get("accelerate"):
        (folder / "accelerate.yaml").write_text(case["accelerate"])
    script = case.get("script")
    if case["verify"] == "acc_prepare":
        opt = "torch.optim.AdamW(model.parameters())" if case["optimizer"] == "real" else \
            "DummyOptim(model.parameters())"
        script = PREPARE.format(opt=opt)
    elif case["verify"] == "ds" and not script:
        script = "import deepspeed\nengine, *_ = deepspeed.initialize(model=model, config='ds.json')\n"
    if script:
        (folder / "train.py").write_text(script)
    if case.get("launcher"):
        (folder / "run.sh").write_text(case["launcher"] + "\n")
    return folder


def _errors(findings) -> List[str]:
    return sorted({f.code for f in findings if f.severity.value == "error"})


def run_checks(all_cases, root: Path) -> Dict[str, Dict[str, Any]]:
    from zeropilot.check import check
    from zeropilot.errors import InputError
    from zeropilot.oracle import ask_many
    from zeropilot.rules import get_rule

    out, launches = {}, []
    started = time.perf_counter()
    for case in all_cases:
        folder = write_launch(case, root)
        try:
            result, launch = check([folder], use_installed=True)
            out[case["name"]] = {"rules": _errors(result.findings), "input_error": None}
            launches.append((case["name"], launch))
        except InputError as exc:
            out[case["name"]] = {"rules": [], "input_error": str(exc), "oracle": []}
    rules_s = time.perf_counter() - started
    started = time.perf_counter()
    reports = ask_many([launch for _, launch in launches])
    oracle_s = time.perf_counter() - started
    for (name, launch), report in zip(launches, reports):
        launch.oracle = report
        found = [f for code in ("OR000", "OR001", "OR002", "OR003") for f in get_rule(code).run(launch)]
        out[name]["oracle"] = _errors(found)
    return {"cases": out, "rules_s": round(rules_s, 2), "oracle_s": round(oracle_s, 2),
            "oracle_import_s": reports[0].import_s if reports else None}


# ---- 3. scoring ---------------------------------------------------------------------------------------------------

def score(all_cases, verdicts, checks) -> Dict[str, Any]:
    rows, differ = [], []
    for case in all_cases:
        truth = "accept" if verdicts[case["name"]] == "ok" else "refuse"
        got = checks["cases"][case["name"]]
        rules, both = bool(got["rules"]), bool(got["rules"] or got["oracle"])
        rows.append(dict(name=case["name"], source=case["source"], upstream=case["expect"], installed=truth,
                         verdict=verdicts[case["name"]], rules=got["rules"], oracle=got["oracle"],
                         input_error=got["input_error"], caught_rules=rules, caught_with_oracle=both))
        if truth != case["expect"]:
            differ.append(case["name"])
    refused = [r for r in rows if r["installed"] == "refuse"]
    accepted = [r for r in rows if r["installed"] == "accept"]
    return {
        "cases": len(rows), "refused": len(refused), "accepted": len(accepted),
        "caught_rules": sum(r["caught_rules"] for r in refused),
        "caught_with_oracle": sum(r["caught_with_oracle"] for r in refused),
        "caught_oracle_alone": sum(bool(r["oracle"]) for r in refused),
        "false_errors_oracle_alone": [r["name"] for r in accepted if r["oracle"]],
        "false_errors_rules": [r["name"] for r in accepted if r["caught_rules"]],
        "false_errors_with_oracle": [r["name"] for r in accepted if r["caught_with_oracle"]],
        "missed_rules": [r["name"] for r in refused if not r["caught_rules"]],
        "missed_with_oracle": [r["name"] for r in refused if not r["caught_with_oracle"]],
        "upstream_expectation_differs": differ, "rows": rows,
    }


def render(summary, checks, versions) -> str:
    s = summary
    lines = [
        "# `zeropilot check` against the libraries' own test cases", "",
        "Command: `DS_ACCELERATOR=cpu python bench/check/detection/run.py` (writes this file and results.json).", "",
        f"Installed: {', '.join(f'{k} {v}' for k, v in sorted(versions.items()))}.", "",
        f"{s['cases']} cases; on the installed versions {s['refused']} are refused and {s['accepted']} accepted.", "",
        "| | rules only (default) | oracle alone (OR rules) | rules + oracle (`--oracle`) |", "|---|---|---|---|",
        f"| refusals caught | {s['caught_rules']} / {s['refused']} | {s['caught_oracle_alone']} / {s['refused']} | "
        f"{s['caught_with_oracle']} / {s['refused']} |",
        f"| false errors (error on an accepted case) | {len(s['false_errors_rules'])} / {s['accepted']} | "
        f"{len(s['false_errors_oracle_alone'])} / {s['accepted']} | {len(s['false_errors_with_oracle'])} / "
        f"{s['accepted']} |",
        f"| time for all {s['cases']} cases | {checks['rules_s']} s | {checks['oracle_s']} s (one worker; imports "
        f"{checks['oracle_import_s']} s) | |", "",
        f"One launch (examples/seed, fresh process, median of 3): `check` {checks['seed_launch_s']['check']} s, "
        f"`check --oracle` {checks['seed_launch_s']['check --oracle']} s.", "",
        "The oracle builds no engine: `no_sync()`, `step()` and `prepare()` refusals are found by the rules only.",
        "The rules were written from the same DeepSpeed/transformers/accelerate source these tests exercise, before "
        "the cases were collected; the cases are not a blind sample of user configs.", "",
        f"Missed by the rules: {', '.join(s['missed_rules']) or 'none'}.", "",
        f"Missed with the oracle: {', '.join(s['missed_with_oracle']) or 'none'}.", "",
        f"False errors: rules {', '.join(s['false_errors_rules']) or 'none'}; with the oracle "
        f"{', '.join(s['false_errors_with_oracle']) or 'none'}.", "",
        f"Upstream expectation differs on the installed versions: {', '.join(s['upstream_expectation_differs']) or 'none'}.",
        "", "| case | source | upstream | installed | rules | oracle |", "|---|---|---|---|---|---|",
    ]
    for r in s["rows"]:
        src = r["source"].split(":", 1)[1]
        lines.append(f"| {r['name']} | `{src}` | {r['upstream']} | {r['installed']} | "
                     f"{','.join(r['rules']) or '-'} | {','.join(r['oracle']) or '-'} |")
    return "\n".join(lines) + "\n"


def cold_cost(runs: int = 3) -> Dict[str, Any]:
    """Wall time of ``zeropilot check examples/seed`` with and without ``--oracle`` (fresh processes, medians)."""
    import statistics

    out = {}
    for label, extra in (("check", []), ("check --oracle", ["--oracle"])):
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "zeropilot", "check", "examples/seed", *extra], cwd=ROOT,
                           capture_output=True, timeout=300, env={**os.environ, "DS_ACCELERATOR": "cpu"})
            times.append(time.perf_counter() - started)
        out[label] = round(statistics.median(times), 2)
    return out


def main() -> int:
    if sys.argv[1:2] == ["--verify"]:
        verify_child(sys.argv[2])
        return 0
    all_cases = cases()
    work = Path(tempfile.mkdtemp(prefix="zp-detect-"))
    verdicts = verify_all(work)
    checks = run_checks(all_cases, work / "launches")
    summary = score(all_cases, verdicts, checks)
    checks["seed_launch_s"] = cold_cost()
    from zeropilot.launch.versions import installed_versions

    versions = {k: v for k, v in installed_versions().items() if k in ("deepspeed", "transformers", "accelerate",
                                                                      "torch")}
    (HERE / "results.json").write_text(json.dumps(dict(summary, timing=checks | {"cases": None},
                                                       versions=versions), indent=1, default=str))
    (HERE / "results.md").write_text(render(summary, checks, versions))
    print(render(summary, checks, versions).split("| case |")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
