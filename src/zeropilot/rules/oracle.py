"""Rules that report what the installed libraries refused (``check --oracle``; see :mod:`zeropilot.oracle`)."""

from __future__ import annotations

from typing import Iterator

from zeropilot.launch import Launch
from zeropilot.rules.registry import Hit, Severity, rule


def _refusals(launch: Launch, library: str) -> Iterator[Hit]:
    report = launch.oracle
    if report is None or report.failure:
        return
    version = report.versions.get(library, "?")
    assumed = launch.versions.raw(library)
    other = assumed is not None and assumed.split("+")[0] != version.split("+")[0]
    for doc in launch.ds_configs:
        for r in report.verdicts.get(id(doc), ()):
            if r.library != library:
                continue
            where = f"`{r.key}`: " if r.key else ""
            note = f" (installed {library} {version} judged; the launch uses {assumed})" if other else ""
            yield Hit(doc, r.node, f"{where}{library} {version} refuses this config ({r.stage}){note} — {r.message}",
                      line=None if r.node is not None else 1, key=r.key,
                      severity=Severity.WARNING if other else None)


@rule("OR001", "refused-by-installed-deepspeed", Severity.ERROR, packages=("deepspeed",),
      versions="the installed DeepSpeed (check --oracle)", witness="tests/oracle/test_oracle.py::test_or001_witness")
def refused_by_installed_deepspeed(launch: Launch) -> Iterator[Hit]:
    """The installed DeepSpeed's `DeepSpeedConfig` refuses the config (only with `check --oracle`).

    The config is built in a subprocess with the launch's world size, after the HF integration filled `"auto"`.
    When the launch uses another version than the installed one (`--versions`, a requirements file), the finding
    is a warning that names both (as for OR002 and OR003).

    ## Why is this bad?
    `deepspeed.initialize` builds the same `DeepSpeedConfig` and raises the same error on every rank, after the
    model has loaded.

    ## Example
    ```json
    {"gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3}}
    ```

    ## Use instead
    ```json
    {"gradient_allreduce_op": "mean", "zero_optimization": {"stage": 3}}
    ```

    ## References
    - `deepspeed/runtime/config.py` `DeepSpeedConfig`; `zeropilot/oracle/worker.py`
    """
    yield from _refusals(launch, "deepspeed")


@rule("OR002", "refused-by-installed-transformers", Severity.ERROR, packages=("transformers",),
      versions="the installed transformers (check --oracle)", witness="tests/oracle/test_oracle.py::test_or002_witness")
def refused_by_installed_transformers(launch: Launch) -> Iterator[Hit]:
    """The installed transformers refuses the DeepSpeed config with its training arguments (only with
    `check --oracle`): `TrainingArguments`, `HfTrainerDeepSpeedConfig` and its mismatch check.

    ## Why is this bad?
    The Trainer raises the same `ValueError` when it builds its arguments or starts training.

    ## Example
    ```json
    {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    ```
    with `per_device_train_batch_size: 2` in the training arguments.

    ## Use instead
    ```json
    {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}
    ```

    ## References
    - `transformers/integrations/deepspeed.py` `HfTrainerDeepSpeedConfig.trainer_config_finalize`
    """
    yield from _refusals(launch, "transformers")


@rule("OR003", "refused-by-installed-accelerate", Severity.ERROR, packages=("accelerate",),
      versions="the installed accelerate (check --oracle)", witness="tests/oracle/test_oracle.py::test_or003_witness")
def refused_by_installed_accelerate(launch: Launch) -> Iterator[Hit]:
    """The installed accelerate's `DeepSpeedPlugin` refuses the DeepSpeed config (only with `check --oracle`).

    ## Why is this bad?
    `Accelerator()` (and the HF Trainer, through it) raises the same error at start-up.

    ## Example
    ```json
    {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}}
    ```

    ## Use instead
    ```json
    {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 0}}
    ```

    ## References
    - `accelerate/utils/dataclasses.py` `DeepSpeedPlugin.__post_init__`, `set_mixed_precision`
    """
    yield from _refusals(launch, "accelerate")


@rule("OR000", "oracle-gave-no-answer", Severity.WARNING, versions="check --oracle",
      witness="tests/oracle/test_oracle.py::test_or000_timeout")
def oracle_gave_no_answer(launch: Launch) -> Iterator[Hit]:
    """`check --oracle` was asked for, but the libraries gave no answer (time limit, crash, not installed).

    ## Why is this bad?
    The check then rests on zeropilot's own rules only.

    ## Example
    ```bash
    zeropilot check --oracle run/   # the worker ran past its time limit
    ```

    ## Use instead
    Run it again with a larger limit, or check the library installation (`python -c "import deepspeed"`).

    ## References
    - `zeropilot/oracle/__init__.py`
    """
    report = launch.oracle
    if report is not None and report.failure:
        yield Hit(None, None, f"the oracle gave no answer: {report.failure}", key="oracle")
