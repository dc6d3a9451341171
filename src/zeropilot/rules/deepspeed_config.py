"""Rules about the DeepSpeed config on its own: keys, types, and values DeepSpeed refuses or ignores."""

from __future__ import annotations

from typing import Iterator

from zeropilot.launch import Launch
from zeropilot.rules.registry import Hit, Severity, rule


def _enabled(doc, section: str):
    node = doc.get(f"{section}.enabled")
    return node if node is not None and node.value is True else None


@rule("DS005", "fp16-and-bf16-both-enabled", Severity.ERROR, packages=("deepspeed",),
      versions="all DeepSpeed versions with bf16 support (>= 0.6)",
      witness="tests/rules/test_deepspeed_config.py::test_ds005_witness")
def fp16_and_bf16_both_enabled(launch: Launch) -> Iterator[Hit]:
    """The DeepSpeed config enables both fp16 and bf16.

    ## Why is this bad?
    DeepSpeed asserts `bfloat16 and fp16 modes cannot be simultaneously enabled` when it builds its
    config, at `deepspeed.initialize`, after the model has been loaded. With the HF integration, `"auto"`
    for both is filled from `--fp16`/`--bf16`, which cannot both be true.

    ## Example
    ```json
    {"fp16": {"enabled": true}, "bf16": {"enabled": true}}
    ```

    ## Use instead
    ```json
    {"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}
    ```
    and choose one with the training arguments (`bf16: true`), or enable only the one your cards support
    (bf16 needs Ampere or newer, or a DCU/ROCm build that supports it).

    ## References
    - `deepspeed/runtime/config.py` `DeepSpeedConfig._initialize_params` (the assertion)
    """
    for doc in launch.ds_configs:
        fp16, bf16 = _enabled(doc, "fp16"), _enabled(doc, "bf16")
        if fp16 is not None and bf16 is not None:
            yield Hit(doc, bf16, "fp16 and bf16 are both enabled: DeepSpeed refuses this at initialize "
                                 "(assertion). Enable one, or set both to \"auto\" under the HF Trainer.")
