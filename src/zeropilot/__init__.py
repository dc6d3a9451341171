"""zeropilot: make DeepSpeed ZeRO training launches work the first time and keep them alive.

The core (``zeropilot.launch``, ``zeropilot.rules``, ``zeropilot.memory``, ``zeropilot.models``)
imports no torch, deepspeed or transformers.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
