"""Model architectures and parameter counts from ``config.json``, without torch.

Use::

    from zeropilot.models import resolve_model, count_params, lora_trainable
    arch = resolve_model("Qwen/Qwen2-7B")          # file, directory, HF cache or catalogue
    arch = resolve_model("org/new-model", hub=HubAccess.from_env())   # ... or the Hub, when asked
    count_params(arch).total, lora_trainable(arch, 16)
"""

from zeropilot.models.arch import CONFIG_SIZE_KEYS, MLA, SUPPORTED_TYPES, Architecture, MoE, from_config
from zeropilot.models.catalogue import CATALOGUE, lookup, normalise
from zeropilot.models.params import ParamCounts, count_params, linear_layers, lora_trainable
from zeropilot.models.resolve import HubAccess, resolve_model

__all__ = ["Architecture", "CATALOGUE", "CONFIG_SIZE_KEYS", "HubAccess", "MLA", "MoE", "ParamCounts", "SUPPORTED_TYPES", "count_params",
           "from_config", "linear_layers", "lookup", "lora_trainable", "normalise", "resolve_model"]
