"""``zeropilot run``'s supervisor: check, run.json, the launch in its own process group, the hang watchdog.

Torch-free: the supervisor reads the run directory the ranks write; only the ranks import torch.
"""

from zeropilot.runner.supervisor import RunOptions, supervise

__all__ = ["RunOptions", "supervise"]
