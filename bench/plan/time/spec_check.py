"""What a spec of ``../zero_mem_probe_plan.py`` may say, checked before any GPU time is spent (no torch here).

``problems(spec)`` checks the values the probe reads; with ``timing=True`` it also checks what a timing row for
``run_rows.py`` needs: every key known (a typo would silently run the default), an id and ``est_wall_s``, one GPU,
and issue 40's protocol (at least ``min_warmup`` warm-up steps and ``min_timed`` timed steps after them).
A row's id (``row_id``) is its ``row``, else its ``name`` (the settings rows' convention: ``name`` the model, ``row``
the setting), unique in a file. Free-form fields of a timing spec: ``name``, ``split``, ``row``, ``group``,
``search``, ``note``, ``meta`` (any JSON) and any key starting with ``pred_`` (a pre-registered prediction).
"""
import json
import re

#: the keys ``zero_mem_probe_plan.py`` reads (its docstring says what each means)
PROBE_KEYS = {
    "model", "stage", "mb", "seq", "ws", "steps", "warmup", "ga", "adam", "gc", "lora", "targets", "mts", "freeze",
    "quant", "double_quant", "quant_storage", "liger", "trainable_fp32", "optim", "cpu_adam", "offload",
    "offload_param", "zero_init", "overlap", "rbs", "pbs", "ppt", "sgs", "mlp", "mrd", "gather", "save",
    "exclude_frozen", "cap_gib", "alloc_conf", "attn", "trace", "trace_frames", "trace_streams",
}
#: what ``run_rows.py`` reads
RUNNER_KEYS = {"est_wall_s", "timeout_s"}
#: free-form fields (the runner and the probe carry them through untouched)
FREE_KEYS = {"name", "split", "row", "group", "search", "note", "meta", "need_gib"}
#: ``adam``: the optimizer a launch gets (the probe's docstring says how each is built)
ADAMS = ("torch", "fused", "client", "cpu")
#: model types whose Liger patch the probe applies: LLaMA-Factory's ``apply_liger_kernel`` table
#: (``model/model_utils/liger_kernel.py``) for the causal LMs the matrix uses
LIGER_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
STAGE3_ONLY = ("offload_param", "mlp", "mrd", "pbs", "ppt", "zero_init")


def row_id(spec):
    """A row's id: ``row`` when it has one, else ``name``."""
    return spec.get("row") or spec.get("name") if isinstance(spec, dict) else None


def _int(spec, key, low):
    value = spec.get(key)
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= low)


def problems(spec, timing=False, min_warmup=2, min_timed=5):
    """What is wrong with one spec, one short sentence each; ``[]`` when nothing is."""
    if not isinstance(spec, dict):
        return ["a spec is a JSON object"]
    out = []
    model = spec.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("model_type"), str):
        out.append("'model' must be an object of HF config fields with a 'model_type'")
    if spec.get("stage") not in (0, 1, 2, 3):
        out.append(f"'stage' must be 0, 1, 2 or 3, not {spec.get('stage')!r}")
    for key, low in (("mb", 1), ("seq", 1), ("steps", 1), ("ga", 1), ("warmup", 0), ("lora", 1), ("ws", 1)):
        if not _int(spec, key, low):
            out.append(f"'{key}' must be an integer >= {low}, not {spec.get(key)!r}")
    steps, warmup = spec.get("steps", 3), spec.get("warmup", 0)
    if _int(spec, "steps", 1) and _int(spec, "warmup", 0) and steps - warmup < 1:
        out.append(f"'steps' ({steps}) must exceed 'warmup' ({warmup}): the median needs a timed step")
    adam = spec.get("adam")
    if adam is not None and adam not in ADAMS:
        out.append(f"'adam' must be one of {', '.join(ADAMS)}, not {adam!r}")
    if adam == "cpu" and not spec.get("offload"):
        out.append("'adam': 'cpu' (DeepSpeed's CPUAdam) needs 'offload' (the optimizer on the CPU)")
    if adam in ("fused", "client") and spec.get("offload"):
        out.append(f"'adam': '{adam}' runs on the GPU; with 'offload' DeepSpeed would use CPUAdam "
                   "('fused') or refuse the client optimizer ('client'): use 'cpu' or 'torch'")
    if spec.get("cpu_adam") and adam not in (None, "cpu"):
        out.append(f"'cpu_adam' and 'adam': '{adam}' contradict each other")
    if spec.get("optim") is not None and adam is not None:
        out.append("'optim' (a client optimizer of its own) and 'adam' contradict each other")
    if spec.get("liger") and isinstance(model, dict) and model.get("model_type") not in LIGER_MODEL_TYPES:
        out.append(f"'liger' is applied to {', '.join(LIGER_MODEL_TYPES)} models only, not "
                   f"{model.get('model_type')!r}")
    if timing:
        out += _timing_problems(spec, min_warmup, min_timed)
    return out


def _timing_problems(spec, min_warmup, min_timed):
    out = []
    unknown = sorted(k for k in spec if k not in PROBE_KEYS | RUNNER_KEYS | FREE_KEYS and not k.startswith("pred_"))
    if unknown:
        out.append(f"unknown key(s) {', '.join(unknown)} (a typo runs the default; free-form notes go under 'meta' "
                   "or a 'pred_' key)")
    for key in ("row", "name"):
        if spec.get(key) is not None and not (isinstance(spec[key], str) and NAME.match(spec[key])):
            out.append(f"'{key}' must be 1-100 letters, digits, '_', '.' or '-' (it names the row's result and logs)")
    if not row_id(spec):
        out.append("a timing row needs an id: 'row' (or 'name')")
    for key in ("est_wall_s", "timeout_s"):
        value = spec.get(key)
        if (value is not None or key == "est_wall_s") and not (
                isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
            out.append(f"'{key}' must be a number of seconds > 0, not {value!r}")
    if spec.get("ws", 1) != 1:
        out.append("the timing runner uses one GPU: 'ws' must be 1")
    if spec.get("stage") in (0, 1, 2):
        out += [f"'{key}' acts under ZeRO-3 only (stage {spec['stage']})" for key in STAGE3_ONLY if spec.get(key)]
    if spec.get("quant") or (spec.get("trace") and spec.get("split") != "trace"):
        out.append("'quant' (a checkpoint on disk) and 'trace' (allocator history) are memory settings, not timed (a row of split 'trace' may record a history: "
                   "its time is not a timing row's)")
    steps, warmup = spec.get("steps", 3), spec.get("warmup", 0)
    if isinstance(steps, int) and isinstance(warmup, int):
        if warmup < min_warmup or steps - warmup < min_timed:
            out.append(f"issue 40's protocol: at least {min_warmup} warm-up steps and {min_timed} timed steps "
                       f"after them (here warmup {warmup}, steps {steps})")
    return out


def read(path, timing=True, min_warmup=2, min_timed=5):
    """A spec file's specs (one JSON object a line, blank lines skipped) and its problems as ``line N: id: ...``;
    with ``timing`` ids must be unique."""
    specs, errors, seen = [], [], {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                spec = json.loads(line)
            except ValueError as e:
                errors.append(f"line {n}: not JSON ({e})")
                continue
            name = row_id(spec) or "?"
            errors += [f"line {n}: {name}: {p}" for p in problems(spec, timing, min_warmup, min_timed)]
            if timing and name in seen:
                errors.append(f"line {n}: {name}: the same id ('row', else 'name') as line {seen[name]}")
            seen.setdefault(name, n)
            specs.append(spec)
    if not specs and not errors:
        errors.append("no spec in the file")
    return specs, errors


def op_builds(specs):
    """The DeepSpeed ops the specs' optimizers build on first use: ``fused_adam`` (FusedAdam), ``cpu_adam``."""
    need = set()
    for spec in specs:
        adam = spec.get("adam") or ("cpu" if spec.get("cpu_adam") and spec.get("offload") else None)
        if adam == "fused":
            need.add("fused_adam")
        if adam == "cpu":
            need.add("cpu_adam")
    return sorted(need)
