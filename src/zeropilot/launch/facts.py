"""Launch facts: the values every rule, ``plan`` and ``repro`` read, derived once and in one place.

What a launch *means* (the ZeRO stage DeepSpeed will run, which precision, the batch values, PEFT, offload,
which training arguments go with which DeepSpeed config) is worked out here, the way the libraries work it
out, and nowhere else. Each value keeps the node it came from, so a finding can point at it.

API (all pure, no torch)::

    from zeropilot.launch.facts import facts, truthy

    f = facts(launch)                 # LaunchFacts, computed once per Launch and cached on it
    for ds in f.ds:                   # DsFacts per DeepSpeed config
        ds.stage                      # 0-3, or None with ds.stage_reason (``"auto"``, ``2.5``)
        ds.batch.micro, ds.batch.ga   # Optional[int]; ds.batch.auto: keys set to "auto"
        ds.precision                  # "fp16", "bf16", "fp32", or None ("auto" under the HF integration)
        ds.offload_optimizer          # "cpu"/"nvme"/None
    f.for_doc(doc)                    # DsFacts of one config
    f.peft(train_doc)                 # whether the training wraps the model in PEFT
    f.settings(train_doc)             # TrainSettings: method, LoRA targets, freeze, quantization, optimizer, fused
                                      # loss and every other memory-relevant key (zeropilot.launch.settings)
    f.hf_pairs                        # (training args, DeepSpeed config) pairs
    truthy("yes")                     # True; the one "is this setting on" helper

How DeepSpeed 0.19.8 reads the stage (checked by ``tests/rules/test_facts.py`` on the installed DeepSpeed):
``"stage": 3.0`` and ``"3"`` are stage 3, ``"stage": true`` is 1, ``"zero_optimization": true`` is the
deprecated boolean form (stage 1), a missing section or ``"stage"`` key is 0, ``"auto"`` is dropped (0 for a raw
DeepSpeed launch; accelerate fills it), ``2.5`` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.launch.document import Document, Node
from zeropilot.launch.values import as_int, truthy  # noqa: F401 - the one "is this setting on" helper, re-exported

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# LLaMA-Factory's finetuning types that wrap the model in PEFT (its default is lora).
_PEFT_TYPES = frozenset({"lora", "oft"})


def is_on(node: Optional[Node]) -> bool:
    """A node that exists and is on (:func:`truthy`)."""
    return node is not None and truthy(node.value) is True


def is_auto(node: Optional[Node]) -> bool:
    return node is not None and node.value == "auto"


@dataclass(frozen=True)
class Batch:
    """The three batch values of a DeepSpeed config; None when absent, ``"auto"`` or not a whole number."""

    train: Optional[int]
    micro: Optional[int]
    ga: Optional[int]
    nodes: Tuple[Optional[Node], Optional[Node], Optional[Node]]
    auto: Tuple[str, ...] = ()

    def node(self, key: str) -> Optional[Node]:
        return self.nodes[BATCH_KEYS.index(key)]


@dataclass
class DsFacts:
    """What one DeepSpeed config means.

    Attributes:
        doc: the config.
        stage: the ZeRO stage DeepSpeed runs (0-3), None when it cannot be known; ``stage_reason`` says why.
        stage_node: the node that decided it (``zero_optimization.stage`` or the section), if any.
        precision: ``fp16``, ``bf16``, ``fp32``, or None when ``"auto"`` leaves it to the HF integration.
        batch: the batch values.
        offload_optimizer, offload_param: the offload device (``cpu``/``nvme``), None when off.
        optimizer: the config's ``optimizer.type``, None without an optimizer section.
        force_ds_cpu_optimizer: ``zero_force_ds_cpu_optimizer`` (DeepSpeed's default: true).
        allow_untested_optimizer: ``zero_allow_untested_optimizer`` (default: false).
        torch_adam: an offloaded optimizer is torch's AdamW rather than DeepSpeed's CPUAdam: the config's
            ``optimizer.params.torch_adam`` (any value Python takes as true, as DeepSpeed does), or no optimizer section
            with ``zero_force_ds_cpu_optimizer: false`` (the client's torch optimizer is allowed); None when the config
            does not say. ``torch_adam_key`` names the key.
        hf: whether the HF Trainer or accelerate read it (``Launch.uses_hf_integration``).
    """

    doc: Document
    stage: Optional[int]
    stage_reason: str
    stage_node: Optional[Node]
    precision: Optional[str]
    batch: Batch
    offload_optimizer: Optional[str]
    offload_param: Optional[str]
    optimizer: Optional[str]
    force_ds_cpu_optimizer: bool
    allow_untested_optimizer: bool
    hf: Optional[bool]
    torch_adam: Optional[bool] = None
    torch_adam_key: str = ""


def zero_stage(doc: Document) -> Tuple[Optional[int], str, Optional[Node]]:
    """(stage, reason, node) as DeepSpeed's ``get_zero_config`` reads it (see the module docstring)."""
    zero = doc.get("zero_optimization")
    if zero is None:
        return 0, "no zero_optimization section", None
    if isinstance(zero.value, bool):
        return (1 if zero.value else 0), "zero_optimization: true|false (deprecated form: true is stage 1)", zero
    if not zero.is_mapping:
        return None, f"zero_optimization is {zero.raw or zero.value!r}, not a section", zero
    node = zero.child("stage")
    if node is None:
        return 0, "zero_optimization.stage absent (default 0)", zero
    value = node.value
    if value == "auto":
        return None, "zero_optimization.stage is \"auto\"", node
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    number = 1 if value is True else 0 if value is False else as_int(value)
    if number is None or not 0 <= number <= 3:
        return None, f"zero_optimization.stage is {node.raw or value!r}, which DeepSpeed refuses", node
    return number, "zero_optimization.stage", node


def precision(doc: Document) -> Optional[str]:
    """``fp16``/``bf16``/``fp32`` by the ``enabled`` flags; None when one is ``"auto"`` and the other is not on."""
    states = {}
    for name, keys in (("fp16", ("fp16",)), ("bf16", ("bf16", "bfloat16"))):
        node = next((doc.get(f"{k}.enabled") for k in keys if doc.get(f"{k}.enabled") is not None), None)
        states[name] = "auto" if is_auto(node) else is_on(node)
    for name in ("bf16", "fp16"):
        if states[name] is True:
            return name
    return None if "auto" in states.values() else "fp32"


def batch(doc: Document) -> Batch:
    nodes = tuple(doc.get(k) for k in BATCH_KEYS)
    values = [as_int(n.value) if n is not None else None for n in nodes]
    auto = tuple(k for k, n in zip(BATCH_KEYS, nodes) if is_auto(n))
    return Batch(values[0], values[1], values[2], nodes, auto)  # type: ignore[arg-type]


def _offload(doc: Document, key: str) -> Optional[str]:
    node = doc.get(f"zero_optimization.{key}.device")
    if node is None or not isinstance(node.value, str) or node.value.lower() in ("none", ""):
        return None
    return node.value.lower()


def ds_facts(doc: Document, hf: Optional[bool] = None) -> DsFacts:
    """The facts of one DeepSpeed config (``hf`` as :meth:`Launch.uses_hf_integration` says)."""
    stage, reason, node = zero_stage(doc)
    opt = doc.get("optimizer.type")
    force = doc.get("zero_force_ds_cpu_optimizer")
    forced = truthy(force.value) is not False if force is not None else True
    torch_adam, torch_adam_key = None, ""
    if doc.get("optimizer.params.torch_adam") is not None:
        # DeepSpeed tests the value as Python does (``if torch_adam:`` in get_optimizer_configuration): "false" is on
        torch_adam, torch_adam_key = bool(doc.value("optimizer.params.torch_adam")), "optimizer.params.torch_adam"
    elif doc.get("optimizer") is None and not forced:
        torch_adam, torch_adam_key = True, "zero_force_ds_cpu_optimizer"
    return DsFacts(doc, stage, reason, node, precision(doc), batch(doc), _offload(doc, "offload_optimizer"),
                   _offload(doc, "offload_param"), opt.value if opt is not None and isinstance(opt.value, str) else
                   None, forced, is_on(doc.get("zero_allow_untested_optimizer")), hf, torch_adam, torch_adam_key)


def uses_peft(train: Document, scripts_text: str = "") -> bool:
    """Whether the training wraps the model in PEFT (LoRA): LLaMA-Factory, axolotl, TRL flags or a script."""
    if train.flavour == "llamafactory":
        ftype = train.value("finetuning_type", "lora")
        return isinstance(ftype, str) and ftype.lower() in _PEFT_TYPES
    if train.flavour == "axolotl":
        adapter = train.value("adapter")
        return isinstance(adapter, str) and adapter.lower() in ("lora", "qlora")
    if is_on(train.get("use_peft")):
        return True
    return "get_peft_model(" in scripts_text or "LoraConfig(" in scripts_text


@dataclass
class LaunchFacts:
    """Facts of a whole launch (see the module docstring)."""

    ds: List[DsFacts] = field(default_factory=list)
    hf_pairs: List[Tuple[Document, Document]] = field(default_factory=list)
    world_size: Optional[int] = None
    world_reason: str = ""
    _scripts_text: str = ""
    _by_doc: Dict[int, DsFacts] = field(default_factory=dict)
    _adapters: List[Document] = field(default_factory=list)
    _scripts: List[Any] = field(default_factory=list)
    _settings: Dict[int, Any] = field(default_factory=dict)

    def for_doc(self, doc: Document) -> DsFacts:
        """The facts of a DeepSpeed config of this launch (computed on demand for any other document)."""
        got = self._by_doc.get(id(doc))
        return got if got is not None else ds_facts(doc)

    def peft(self, train: Document) -> bool:
        return uses_peft(train, self._scripts_text)

    def settings(self, train: Optional[Document]):
        """The memory-relevant training settings (:class:`zeropilot.launch.settings.TrainSettings`) of the launch
        whose training arguments are ``train`` (None: only adapter configs and scripts), derived once."""
        from zeropilot.launch.settings import train_settings

        key = id(train)
        if key not in self._settings:
            self._settings[key] = train_settings(train, self._adapters, self._scripts)
        return self._settings[key]


def facts(launch) -> LaunchFacts:
    """The launch's facts, derived once and cached on the launch object."""
    cached = getattr(launch, "_facts", None)
    if cached is not None:
        return cached
    from zeropilot.launch.settings import is_adapter_config

    out = LaunchFacts(world_size=launch.world_size.value, world_reason=launch.world_size.reason,
                      _scripts_text="\n".join(py.text for py in launch.python_files),
                      _adapters=[d for d in launch.documents if is_adapter_config(d)],
                      _scripts=list(launch.python_files))
    for doc in launch.ds_configs:
        f = ds_facts(doc, launch.uses_hf_integration(doc))
        out.ds.append(f)
        out._by_doc[id(doc)] = f
    out.hf_pairs = launch.training_pairs()
    launch._facts = out
    return out
