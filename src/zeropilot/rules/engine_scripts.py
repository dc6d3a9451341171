"""Rules about raw ``deepspeed.initialize`` scripts against their config: ``no_sync()``, client optimizers.

Scripts are parsed with ``ast``, never run. The config a script uses is every DeepSpeed config of the launch that
the HF Trainer or accelerate do not read (``DsFacts.hf`` is not True). What DeepSpeed does was seen on a real
one-rank engine (``tests/rules/init_probe.py``).
"""

from __future__ import annotations

import ast
from typing import Dict, Iterator, List, Optional

from zeropilot.launch import Launch, PythonFile
from zeropilot.launch.facts import DsFacts, facts
from zeropilot.rules.python_scripts import _hit, _text, _trees
from zeropilot.rules.registry import Hit, Severity, rule

# deepspeed/runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS (0.19.8), by class name.
ZERO_TESTED = frozenset({"Adam", "AdamW", "FusedAdam", "DeepSpeedCPUAdam", "ZenFlowCPUAdam", "Adagrad",
                         "DeepSpeedCPUAdagrad", "DeepSpeedCPULion", "FusedLion", "MuonWithAuxAdam"})
# Client optimizers the offload check accepts (engine._configure_optimizer).
DS_CPU_OPTIMIZERS = frozenset({"DeepSpeedCPUAdam", "DeepSpeedCPULion"})


def _raw_configs(launch: Launch) -> List[DsFacts]:
    return [f for f in facts(launch).ds if f.hf is not True]


def _with_no_sync(tree: ast.AST) -> Iterator[ast.With]:
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and any(
                isinstance(item.context_expr, ast.Call) and isinstance(item.context_expr.func, ast.Attribute)
                and item.context_expr.func.attr == "no_sync" for item in node.items):
            yield node


def _calls_named(body: List[ast.stmt], name: str) -> Iterator[ast.Call]:
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name:
                yield node


def _partitions_gradients(launch: Launch) -> Optional[DsFacts]:
    """The first raw config at ZeRO-2/3, if any."""
    return next((f for f in _raw_configs(launch) if f.stage is not None and f.stage >= 2), None)


@rule("PY004", "no-sync-under-zero-2-3", Severity.ERROR, packages=("deepspeed",),
      versions="deepspeed >= 0.16.0 (DeepSpeedEngine.no_sync)",
      witness="tests/rules/test_engine_scripts.py::test_py004_witness")
def no_sync_under_zero_2_3(launch: Launch) -> Iterator[Hit]:
    """`with engine.no_sync():` in a script whose DeepSpeed config partitions gradients (ZeRO-2/3).

    ## Why is this bad?
    `DeepSpeedEngine.no_sync()` asserts `no_sync context manager is incompatible with gradient partitioning logic
    of ZeRO stage 2` when entered, at the first accumulation step. DeepSpeed accumulates by itself: call
    `engine.backward()` and `engine.step()` on every micro-batch.

    ## Example
    ```python
    with engine.no_sync():
        engine.backward(loss)
    ```
    with `{"zero_optimization": {"stage": 2}}`.

    ## Use instead
    ```python
    engine.backward(loss)
    engine.step()   # DeepSpeed reduces only at its accumulation boundary
    ```

    ## References
    - `deepspeed/runtime/engine.py` `DeepSpeedEngine.no_sync` (0.16.0, PR #6675)
    """
    cfg = _partitions_gradients(launch)
    if cfg is None:
        return
    for py, tree in _trees(launch):
        for node in _with_no_sync(tree):
            yield _hit(py, node, "no_sync", f"`{_text(node.items[0].context_expr)}` with ZeRO-{cfg.stage} "
                                            f"({cfg.doc.path.name}): DeepSpeed asserts no_sync is incompatible with "
                                            f"gradient partitioning at the first step — drop no_sync(); the engine "
                                            f"accumulates by itself")


@rule("PY005", "engine-step-inside-no-sync", Severity.ERROR, packages=("deepspeed",),
      versions="deepspeed >= 0.16.0 (DeepSpeedEngine.no_sync)",
      witness="tests/rules/test_engine_scripts.py::test_py005_witness")
def engine_step_inside_no_sync(launch: Launch) -> Iterator[Hit]:
    """`engine.step()` called inside `with engine.no_sync():`.

    ## Why is this bad?
    DeepSpeed asserts `It is illegal to call Engine.step() inside no_sync context manager`, at the first step.

    ## Example
    ```python
    with engine.no_sync():
        engine.backward(loss)
        engine.step()
    ```

    ## Use instead
    ```python
    with engine.no_sync():
        engine.backward(loss)
    engine.step()
    ```

    ## References
    - `deepspeed/runtime/engine.py` `DeepSpeedEngine.step` (the `inside_no_sync_ctxt` assertion)
    """
    for py, tree in _trees(launch):
        if "deepspeed" not in py.text:
            continue
        for node in _with_no_sync(tree):
            for call in _calls_named(node.body, "step"):
                yield _hit(py, call, "step", f"`{_text(call)}` inside `{_text(node.items[0].context_expr)}`: "
                                             f"DeepSpeed asserts it is illegal to call step() there — step after "
                                             f"the with block")


def _assignments(tree: ast.AST) -> Dict[str, ast.AST]:
    out: Dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
    return out


def _client_optimizers(py: PythonFile, tree: ast.AST) -> Iterator[tuple]:
    """(initialize call, optimizer class name, the class expression's text) for ``initialize(optimizer=...)``."""
    assigned = _assignments(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _text(node.func).endswith("initialize")):
            continue
        expr = next((k.value for k in node.keywords if k.arg == "optimizer"), None)
        if isinstance(expr, ast.Name) and expr.id in assigned:
            expr = assigned[expr.id]
        if isinstance(expr, ast.Call):
            cls = expr.func
            name = cls.attr if isinstance(cls, ast.Attribute) else getattr(cls, "id", None)
            if name and name[:1].isupper():
                yield node, name, _text(cls)


def _client_optimizers_outside(launch: Launch, allowed: frozenset) -> Iterator[tuple]:
    """(python file, initialize call, class text) for every client optimizer whose class is not in ``allowed``."""
    for py, tree in _trees(launch):
        for call, name, text in _client_optimizers(py, tree):
            if name not in allowed:
                yield py, call, text


@rule("PY006", "untested-client-optimizer-under-zero", Severity.ERROR, packages=("deepspeed",),
      versions="all DeepSpeed versions with ZeRO (tested list as of 0.19.8)",
      witness="tests/rules/test_engine_scripts.py::test_py006_witness")
def untested_client_optimizer_under_zero(launch: Launch) -> Iterator[Hit]:
    """A client optimizer ZeRO has not tested (`torch.optim.SGD`, ...) without `zero_allow_untested_optimizer`.

    ZeRO's tested optimizers are Adam, AdamW, Adagrad, FusedAdam, FusedLion and DeepSpeed's CPU optimizers.

    ## Why is this bad?
    `deepspeed.initialize` asserts `You are using an untested ZeRO Optimizer. Please add
    <"zero_allow_untested_optimizer": true>`, after the model has loaded.

    ## Example
    ```python
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                      config="ds.json")   # ZeRO-2
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": true}
    ```

    ## References
    - `deepspeed/runtime/engine.py` `_do_optimizer_sanity_check`; `deepspeed/runtime/zero/utils.py`
      `ZERO_SUPPORTED_OPTIMIZERS`
    """
    configs = [f for f in _raw_configs(launch) if f.stage and not f.allow_untested_optimizer]
    if not configs:
        return
    for py, call, text in _client_optimizers_outside(launch, ZERO_TESTED):
        yield _hit(py, call, "optimizer", f"client optimizer {text} is not one ZeRO has tested and "
                                          f"{configs[0].doc.path.name} (ZeRO-{configs[0].stage}) does not set "
                                          f"zero_allow_untested_optimizer: deepspeed.initialize asserts — "
                                          f"add \"zero_allow_untested_optimizer\": true")


@rule("PY007", "client-optimizer-with-optimizer-offload", Severity.ERROR, packages=("deepspeed",),
      versions="deepspeed >= 0.10 (zero_force_ds_cpu_optimizer; checked on 0.19.8)",
      witness="tests/rules/test_engine_scripts.py::test_py007_witness")
def client_optimizer_with_optimizer_offload(launch: Launch) -> Iterator[Hit]:
    """A client torch optimizer with `offload_optimizer` while `zero_force_ds_cpu_optimizer` is true (the default).

    ## Why is this bad?
    `deepspeed.initialize` raises `ZeRORuntimeException: You are using ZeRO-Offload with a client provided
    optimizer`, after the model has loaded: offloaded optimizer states need DeepSpeed's CPU optimizer.

    ## Example
    ```python
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()),
                                      config="ds.json")   # offload_optimizer: {"device": "cpu"}
    ```

    ## Use instead
    Put the optimizer in the config (`"optimizer": {"type": "AdamW", ...}`), pass
    `deepspeed.ops.adam.DeepSpeedCPUAdam`, or set `"zero_force_ds_cpu_optimizer": false` (slow).

    ## References
    - `deepspeed/runtime/engine.py` `DeepSpeedEngine._configure_optimizer`
    """
    configs = [f for f in _raw_configs(launch) if f.stage and f.offload_optimizer in ("cpu", "nvme")
               and f.force_ds_cpu_optimizer]
    if not configs:
        return
    for py, call, text in _client_optimizers_outside(launch, DS_CPU_OPTIMIZERS):
        yield _hit(py, call, "optimizer", f"client optimizer {text} with offload_optimizer "
                                          f"({configs[0].doc.path.name}) and zero_force_ds_cpu_optimizer "
                                          f"true (the default): deepspeed.initialize raises "
                                          f"ZeRORuntimeException — use DeepSpeedCPUAdam or the config's "
                                          f"optimizer")
