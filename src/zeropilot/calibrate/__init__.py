"""``zeropilot calibrate``: measure what ``plan`` cannot know on the user's own machine (memory outside
PyTorch per rank, the allocator's behaviour, the disk's write speed) into a hardware profile.

``profile`` (torch-free) reads, finds and applies profiles; ``run`` starts the torch workers
(``worker``) and writes the profile. Docs: ``docs/calibrate.md``.
"""

from zeropilot.memory.profile import Profile, apply, find, load

__all__ = ["Profile", "apply", "find", "load"]
