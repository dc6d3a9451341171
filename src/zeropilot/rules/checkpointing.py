"""Rules: checkpointing (see zeropilot.rules.registry for how to add one)."""

from __future__ import annotations
