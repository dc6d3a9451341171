"""Rules about Python training scripts given to check (parsed with ``ast``, never run)."""

from __future__ import annotations

import ast
from typing import Iterator, List, Optional

from zeropilot.checkpoint.names import MODEL_STATES_SUFFIX, OPTIM_STATES_SUFFIX, ZERO12_MODEL_FILE
from zeropilot.launch import Launch, PythonFile
from zeropilot.rules.registry import Hit, Severity, rule

_COLLECTIVE_CALLS = ("save_checkpoint", "load_checkpoint")
_RANK_NAMES = ("rank", "local_rank", "global_rank", "process_index", "local_process_index")
_MAIN_FLAGS = ("is_main_process", "is_local_main_process", "is_world_process_zero", "is_local_process_zero")


def _text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # very old or odd trees
        return ""


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)


def _rank_expr(node: ast.AST) -> bool:
    """``rank``, ``args.local_rank``, ``dist.get_rank()``, ``os.environ["RANK"]`` and the like."""
    if isinstance(node, ast.Call):
        if getattr(node.func, "id", "") == "int":
            return any("RANK" in _text(a) for a in node.args)
        node = node.func
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
        return name in ("get_rank", "get_local_rank", "get_global_rank")
    if isinstance(node, ast.Attribute):
        return node.attr in _RANK_NAMES
    if isinstance(node, ast.Name):
        return node.id in _RANK_NAMES
    if isinstance(node, ast.Subscript):
        return "RANK" in _text(node)
    return False


def _rank_zero_test(test: ast.AST) -> bool:
    """Whether an ``if`` condition holds on rank 0 only."""
    if isinstance(test, ast.BoolOp):
        return isinstance(test.op, ast.And) and any(_rank_zero_test(v) for v in test.values)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        left, right = test.left, test.comparators[0]
        return (_is_zero(right) and _rank_expr(left)) or (_is_zero(left) and _rank_expr(right))
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.In):
        # `args.local_rank in [-1, 0]`: rank 0 of a distributed run, or a single process
        right = test.comparators[0]
        items = right.elts if isinstance(right, (ast.List, ast.Tuple, ast.Set)) else []
        return _rank_expr(test.left) and any(_is_zero(e) for e in items)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _rank_expr(test.operand) and not isinstance(test.operand, ast.Call) or \
            (isinstance(test.operand, ast.Call) and _text(test.operand.func).endswith("get_rank"))
    target = test.func if isinstance(test, ast.Call) else test
    if isinstance(target, ast.Attribute):
        return target.attr in _MAIN_FLAGS
    if isinstance(target, ast.Name):
        return target.id in _MAIN_FLAGS
    return False


def _calls_in(nodes: List[ast.stmt], names) -> Iterator[ast.Call]:
    for stmt in nodes:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names:
                yield node


def _trees(launch: Launch) -> Iterator[tuple]:
    for py in launch.python_files:
        if py.tree is not None:
            yield py, py.tree


def _hit(py: PythonFile, node: ast.AST, key: str, message: str) -> Hit:
    return Hit(None, None, message, file=py.path, line=getattr(node, "lineno", None), key=key,
               col=getattr(node, "col_offset", None))


@rule("PY001", "rank-zero-only-checkpoint-call", Severity.ERROR, packages=("deepspeed",), versions="all",
      witness="tests/rules/test_python_scripts.py::test_py001_witness")
def rank_zero_only_checkpoint_call(launch: Launch) -> Iterator[Hit]:
    """`engine.save_checkpoint` / `load_checkpoint` called only on rank 0.

    ## Why is this bad?
    Both are collective: every rank writes or reads its own ZeRO partition, and they synchronise
    inside. Called on rank 0 only, rank 0 waits in a collective the others never join while they run
    on into the next step: the job hangs until the process-group timeout (or fails with mismatched
    collectives), and no checkpoint is written (seen on 2 gloo ranks).

    ## Example
    ```python
    if dist.get_rank() == 0:
        engine.save_checkpoint(args.output_dir)
    ```

    ## Use instead
    ```python
    engine.save_checkpoint(args.output_dir)   # on every rank; DeepSpeed decides who writes what
    if dist.get_rank() == 0:
        tokenizer.save_pretrained(args.output_dir)   # rank-0-only work is fine for plain files
    ```

    ## References
    - DeepSpeed docs, "Model Checkpointing" ("must be called on all processes")
    - `deepspeed/runtime/engine.py` `DeepSpeedEngine.save_checkpoint`
    """
    for py, tree in _trees(launch):
        for node in ast.walk(tree):
            if not isinstance(node, ast.If) or not _rank_zero_test(node.test):
                continue
            for call in _calls_in(node.body, _COLLECTIVE_CALLS):
                name = call.func.attr
                yield _hit(py, call, name, f"{name} is called only on rank 0 (under `if {_text(node.test)}`): it "
                                           "is collective, so rank 0 waits for ranks that never join and the job "
                                           f"hangs until the timeout; call {name} on every rank.")


def _step_calls(body: List[ast.stmt]) -> Iterator[ast.Call]:
    for call in _calls_in(body, ("step",)):
        receiver = _text(call.func.value).lower()
        if not call.args and not call.keywords and ("engine" in receiver or receiver == "model"):
            yield call


def _accumulation_test(test: ast.AST) -> bool:
    """``(step + 1) % accum == 0`` and the like."""
    for node in ast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            text = _text(node.right).lower()
            if "accum" in text or "gradient_accumulation" in text or text in ("ga", "grad_acc", "ga_steps"):
                return True
    return False


@rule("PY002", "engine-step-skipped-under-accumulation", Severity.ERROR, packages=("deepspeed",), versions="all",
      witness="tests/rules/test_python_scripts.py::test_py002_witness")
def engine_step_skipped_under_accumulation(launch: Launch) -> Iterator[Hit]:
    """`engine.step()` called only every N micro-batches, as with a plain PyTorch optimizer.

    ## Why is this bad?
    A DeepSpeed engine counts micro-batches itself: `engine.step()` must be called after every
    `engine.backward()`, and it steps the optimizer only at the accumulation boundary set by
    `gradient_accumulation_steps`. Skipped by hand, the engine sees one micro-step per N batches and
    reaches its boundary N times later — or never: with GA 4 and 8 micro-batches, 0 optimizer steps
    instead of 2 (seen on a real engine); the gradients keep accumulating.

    ## Example
    ```python
    for i, batch in enumerate(loader):
        engine.backward(engine(**batch).loss)
        if (i + 1) % args.gradient_accumulation_steps == 0:
            engine.step()
    ```

    ## Use instead
    ```python
    for batch in loader:
        engine.backward(engine(**batch).loss)
        engine.step()   # the engine steps the optimizer at its own accumulation boundary
    ```

    ## References
    - DeepSpeed docs, "Training" (`engine.step()` after each backward)
    - `deepspeed/runtime/engine.py` `DeepSpeedEngine.step`, `is_gradient_accumulation_boundary`
    """
    for py, tree in _trees(launch):
        if "deepspeed" not in py.text:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and _accumulation_test(node.test):
                for call in _step_calls(node.body):
                    yield _hit(py, call, "step", f"{_text(call)} runs only when `{_text(node.test)}`: a DeepSpeed "
                                                 "engine counts micro-batches itself, so it steps the optimizer N "
                                                 "times too rarely or never; call engine.step() after every "
                                                 "backward.")


def _shard_path(node: ast.AST) -> Optional[str]:
    """The ZeRO shard file name pattern a path expression names, if any."""
    text = _text(node)
    if OPTIM_STATES_SUFFIX in text:
        return "optimizer shard"
    if ZERO12_MODEL_FILE in text:
        return "engine model-states file"
    if MODEL_STATES_SUFFIX in text:
        return "model-states shard"
    return None


def _assigned(tree: ast.AST) -> dict:
    """name -> the value expressions assigned to it anywhere in the module (``x = ...``, ``for x in ...``)."""
    out: dict = {}
    for node in ast.walk(tree):
        pairs = []
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, (ast.For, ast.comprehension)):
            pairs = [(node.target, node.iter)]
        for target, value in pairs:
            if isinstance(target, ast.Name):
                out.setdefault(target.id, []).append(value)
    return out


def _torch_loads(tree: ast.AST) -> Iterator[tuple]:
    """(call, kind) for each torch.load of a ZeRO rank file (a literal path, or a name assigned one)."""
    names = _assigned(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _text(node.func) in ("torch.load", "load") and node.args:
            arg = node.args[0]
            candidates = [arg] + (names.get(arg.id, []) if isinstance(arg, ast.Name) else [])
            kind = next((k for k in map(_shard_path, candidates) if k is not None), None)
            if kind is not None:
                yield node, kind


@rule("PY003", "zero-shard-loaded-as-model", Severity.ERROR, packages=("deepspeed",), versions="all",
      witness="tests/rules/test_python_scripts.py::test_py003_witness")
def zero_shard_loaded_as_model(launch: Launch) -> Iterator[Hit]:
    """A DeepSpeed rank file (`*_model_states.pt`, `*_optim_states.pt`) loaded with `torch.load` as weights.

    ## Why is this bad?
    These files are an engine's pickled state, not a state dict: the model-states file is a dict of
    `module`, `buffer_names`, `param_shapes`… and under ZeRO-3 its tensors are 0-element
    placeholders; the optimizer files hold flat fp32 partitions. `load_state_dict` on them raises
    missing/unexpected keys or size mismatches, and with `strict=False` silently loads nothing (seen on
    a real checkpoint). They also unpickle arbitrary objects (`weights_only=False`).

    ## Example
    ```python
    sd = torch.load("ckpt/global_step100/zero_pp_rank_0_mp_rank_00_model_states.pt")
    model.load_state_dict(sd, strict=False)
    ```

    ## Use instead
    ```bash
    zeropilot ckpt export ckpt/ out/   # or: python ckpt/zero_to_fp32.py ckpt/ out/
    ```
    then `AutoModelForCausalLM.from_pretrained("out/")`, or `engine.load_checkpoint(...)` to resume.

    ## References
    - `deepspeed/utils/zero_to_fp32.py`; `deepspeed/runtime/engine.py` `_save_checkpoint` (file contents)
    """
    for py, tree in _trees(launch):
        loads = list(_torch_loads(tree))
        if not loads:
            continue
        uses_as_weights = "load_state_dict" in py.text or "from_pretrained" in py.text
        if not uses_as_weights:
            continue
        for call, kind in loads:
            yield _hit(py, call, "torch.load", f"torch.load of a DeepSpeed {kind} used as model weights: it is "
                                               "the engine's pickled state (placeholders or flat partitions), "
                                               "so load_state_dict fails or loads nothing; export the "
                                               "checkpoint first (zeropilot ckpt export / zero_to_fp32.py).")
