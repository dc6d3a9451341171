"""Rules about collective timeouts: values that can never fire, groups they do not reach, and
variables that nothing reads."""

from __future__ import annotations

from typing import Iterator, Optional

from zeropilot.launch import Launch
from zeropilot.rules.checkpointing import hf_pairs
from zeropilot.rules.registry import Hit, Severity, rule

# No collective of a healthy fine-tuning run waits a day: beyond this a hang is never reported.
NEVER_FIRES_S = 24 * 3600
# torch's default for new process groups: 10 minutes for NCCL (torch/distributed/constants.py).
NCCL_DEFAULT_S = 600
# Environment variables people export for timeouts that no layer of the stack reads (see the witness).
UNREAD_TIMEOUT_VARS = ("NCCL_TIMEOUT", "TORCH_DISTRIBUTED_TIMEOUT")


def _seconds(value) -> Optional[float]:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _human(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:,.0f} days"
    if seconds >= 7200:
        return f"{seconds / 3600:,.0f} hours"
    return f"{seconds / 60:,.0f} minutes"


@rule("TO001", "ddp-timeout-never-fires", Severity.WARNING, packages=("transformers",), versions="all",
      witness="tests/rules/test_timeouts.py::test_to001_witness")
def ddp_timeout_never_fires(launch: Launch) -> Iterator[Hit]:
    """A `ddp_timeout` so long that a hung collective is never reported.

    ## Why is this bad?
    `ddp_timeout` is in **seconds** (default 1800) and becomes the timeout of the world process group.
    `18000000` is about 208 days, not 30 minutes: when one rank dies or hangs (an OOM on one card, a
    stuck save), the others wait in their collective until someone notices and kills the job, holding
    every GPU. Very long values are sometimes set so that rank 0 can tokenize a dataset while the
    others wait; preprocess the data beforehand (or raise the value to hours, not months) instead.

    ## Example
    ```yaml
    ddp_timeout: 18000000
    ```

    ## Use instead
    ```yaml
    ddp_timeout: 7200   # 2 hours: longer than any save or evaluation, short enough to notice a hang
    ```

    ## References
    - `transformers/training_args.py` `TrainingArguments.ddp_timeout` / `ddp_timeout_delta`
    - `torch/distributed/distributed_c10d.py` `init_process_group(timeout=...)`
    """
    for doc in launch.train_args:
        node = doc.get("ddp_timeout")
        seconds = _seconds(node.value) if node is not None else None
        if seconds is None or seconds <= NEVER_FIRES_S:
            continue
        yield Hit(doc, node, f"ddp_timeout is seconds: {node.value} s is {_human(seconds)}, so a hung rank is "
                             "never reported and the job holds its GPUs until killed; use hours (e.g. 7200) "
                             "and preprocess the dataset before launching if rank 0 needs long.")


@rule("TO002", "ddp-timeout-misses-deepspeed-groups", Severity.WARNING, packages=("transformers", "deepspeed"),
      versions="all (transformers #32036, #38933; accelerate #3680)",
      witness="tests/rules/test_timeouts.py::test_to002_witness")
def ddp_timeout_misses_deepspeed_groups(launch: Launch) -> Iterator[Hit]:
    """`ddp_timeout` raised above torch's default under DeepSpeed, expecting it to cover saves and gathers.

    ## Why is this bad?
    Under the HF Trainer, `ddp_timeout` sets only the world process group. ZeRO reduces, gathers and
    saves over DeepSpeed's own data-parallel group, a clone made with `dist.new_group` without a
    timeout, which keeps torch's default: 10 minutes on NCCL, 30 on gloo. A ZeRO-3 save or a gather
    slower than that still fails with a collective timeout, whatever `ddp_timeout` says. Seen on a real
    HF Trainer + ZeRO-2 run (gloo): world group 5000 s, ZeRO group 1800 s; and on an H200 with NCCL
    (torch 2.11): world group 5000 s, a group cloned the same way 600 s.

    ## Example
    ```yaml
    deepspeed: ds_z3_config.json
    ddp_timeout: 7200   # expected to cover a 20-minute save
    ```

    ## Use instead
    Keep each save well under 10 minutes (fewer, smaller saves), or, in your own training script, raise
    torch's default for new groups before `trainer.train()` (DeepSpeed clones its group then):
    ```python
    import datetime, torch.distributed.distributed_c10d as c10d
    c10d.default_pg_nccl_timeout = datetime.timedelta(hours=2)   # NCCL
    c10d.default_pg_timeout = datetime.timedelta(hours=2)        # gloo and others
    ```

    ## References
    - `deepspeed/utils/groups.py` `_clone_world_group` (`dist.new_group(ranks=...)`, no timeout)
    - transformers #32036, #38933; accelerate #3680; LlamaFactory #2902
    """
    for train, _ds, stage in hf_pairs(launch):
        if stage == 0:
            continue
        node = train.get("ddp_timeout")
        seconds = _seconds(node.value) if node is not None else None
        if seconds is None or seconds <= NCCL_DEFAULT_S:
            continue
        yield Hit(train, node, f"ddp_timeout ({node.value} s) does not reach DeepSpeed's ZeRO process group, "
                               "which keeps torch's default (10 min on NCCL): a save or gather slower than that "
                               "still times out; keep saves short or raise torch's default group timeout.")


@rule("TO003", "deepspeed-timeout-ignored-under-hf", Severity.WARNING, packages=("deepspeed", "transformers"),
      versions="deepspeed >= 0.9 (DEEPSPEED_TIMEOUT); default 30 min until 0.19.5, 10 min from 0.19.6",
      witness="tests/rules/test_timeouts.py::test_to003_witness")
def deepspeed_timeout_ignored_under_hf(launch: Launch) -> Iterator[Hit]:
    """`DEEPSPEED_TIMEOUT` exported for a launch run by the HF Trainer or accelerate.

    ## Why is this bad?
    DeepSpeed reads `DEEPSPEED_TIMEOUT` (in **minutes**) once, at import, as the default timeout of
    `deepspeed.init_distributed`. Under the HF Trainer and accelerate, torch.distributed is initialised
    with `ddp_timeout` (or accelerate's `InitProcessGroupKwargs`) instead, and DeepSpeed's own groups
    keep torch's default: the variable changes nothing (seen on a real run with `DEEPSPEED_TIMEOUT=1`).
    Read as seconds (`DEEPSPEED_TIMEOUT=1800`) it would also be 30 hours, not 30 minutes.

    ## Example
    ```bash
    export DEEPSPEED_TIMEOUT=1800
    llamafactory-cli train sft.yaml
    ```

    ## Use instead
    ```yaml
    ddp_timeout: 7200   # seconds; the world group's timeout under the HF Trainer
    ```

    ## References
    - `deepspeed/constants.py` (`default_pg_timeout = timedelta(minutes=int(os.getenv("DEEPSPEED_TIMEOUT", ...)))`)
    - `accelerate/state.py` `PartialState.__init__` (initialises the process group with its own timeout)
    - DeepSpeed PR #8253 (default 30 -> 10 minutes in 0.19.6)
    """
    setting = launch.env().get("DEEPSPEED_TIMEOUT")
    if setting is None or not (launch.train_args or launch.accelerate_configs):
        return
    yield Hit(None, None, f"DEEPSPEED_TIMEOUT={setting.value} is ignored: under the HF Trainer/accelerate "
                          "torch.distributed is initialised with ddp_timeout, and the variable is minutes "
                          "anyway; set ddp_timeout (seconds) in the training arguments instead.",
              file=setting.file, line=setting.line, key=setting.name)


@rule("TO004", "unread-timeout-variable", Severity.WARNING, packages=("torch", "deepspeed", "transformers",
                                                                        "accelerate"),
      versions="all", witness="tests/rules/test_timeouts.py::test_to004_witness")
def unread_timeout_variable(launch: Launch) -> Iterator[Hit]:
    """An exported timeout variable that nothing in the training stack reads (`NCCL_TIMEOUT`).

    ## Why is this bad?
    No layer reads `NCCL_TIMEOUT` or `TORCH_DISTRIBUTED_TIMEOUT`: not PyTorch (Python or its C++
    libraries), DeepSpeed, transformers, accelerate or PEFT, and not NCCL, whose only timeout variable
    is `NCCL_IB_TIMEOUT` (an InfiniBand transport knob). Exporting it "to prevent save timeouts" leaves
    the timeouts exactly as they were.

    ## Example
    ```bash
    export NCCL_TIMEOUT=1800
    ```

    ## Use instead
    ```yaml
    ddp_timeout: 7200   # in the training arguments (seconds)
    ```
    and see TO002 for DeepSpeed's own groups.

    ## References
    - NCCL documentation, "Environment Variables" (no NCCL_TIMEOUT); NCCL's `libnccl.so.2` shipped with
      torch 2.11+cu130 holds the string `NCCL_IB_TIMEOUT` but not `NCCL_TIMEOUT`
      (`tests/witness/cuda_probe_h200.json`)
    - witness: the name is absent from the installed torch, deepspeed, transformers, accelerate, peft
    """
    env = launch.env()
    for name in UNREAD_TIMEOUT_VARS:
        setting = env.get(name)
        if setting is None:
            continue
        yield Hit(None, None, f"{name} is read by nothing (not NCCL, PyTorch, DeepSpeed, transformers or "
                              "accelerate): it does not change any timeout; set ddp_timeout in the training "
                              "arguments instead.", file=setting.file, line=setting.line, key=name)


@rule("TO005", "deepspeed-timeout-never-fires", Severity.WARNING, packages=("deepspeed",),
      versions="deepspeed >= 0.9 (DEEPSPEED_TIMEOUT is read in minutes)",
      witness="tests/rules/test_timeouts.py::test_to005_witness")
def deepspeed_timeout_never_fires(launch: Launch) -> Iterator[Hit]:
    """`DEEPSPEED_TIMEOUT` written as if it were seconds: more than a day of minutes.

    ## Why is this bad?
    DeepSpeed reads `DEEPSPEED_TIMEOUT` as **minutes** (`timedelta(minutes=int(...))`): `1800`, meant as
    30 minutes, is 30 hours, so a hung rank of a raw `deepspeed` launch is not reported for more than a
    day. (Under the HF Trainer the variable is not used at all: TO003.)

    ## Example
    ```bash
    export DEEPSPEED_TIMEOUT=1800
    ```

    ## Use instead
    ```bash
    export DEEPSPEED_TIMEOUT=30   # minutes
    ```

    ## References
    - `deepspeed/constants.py` (`default_pg_timeout = timedelta(minutes=int(os.getenv("DEEPSPEED_TIMEOUT", ...)))`)
    """
    setting = launch.env().get("DEEPSPEED_TIMEOUT")
    minutes = _seconds(setting.value) if setting is not None else None
    if minutes is None or minutes * 60 <= NEVER_FIRES_S:
        return
    yield Hit(None, None, f"DEEPSPEED_TIMEOUT is minutes: {setting.value} is {_human(minutes * 60)}, so a hung "
                          f"rank is not reported for that long; write minutes (30, not 1800).",
              file=setting.file, line=setting.line, key=setting.name)
