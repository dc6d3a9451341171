"""The guard reads the allocator's nested counters; the names match what ``torch.cuda.memory_stats`` flattens.

Witness on the installed torch: its real ``memory_stats`` flattens the same nested dict (on this CPU-only
machine the allocator's dict is given to it through ``memory_stats_as_nested_dict``, which it calls).
"""

from __future__ import annotations

import types

import pytest

from zeropilot.guard import telemetry

torch = pytest.importorskip("torch")

NESTED = {"allocated_bytes": {"all": {"current": 5, "peak": 9, "allocated": 11, "freed": 6},
                              "large_pool": {"current": 4, "peak": 8, "allocated": 9, "freed": 5}},
          "reserved_bytes": {"all": {"current": 8, "peak": 10, "allocated": 10, "freed": 2}},
          "num_alloc_retries": 2, "num_ooms": 1, "num_device_alloc": 3}


def test_nested_counters_equal_memory_stats_flat_names(monkeypatch):
    monkeypatch.setattr(torch.cuda.memory, "memory_stats_as_nested_dict", lambda device=None: NESTED)
    flat = torch.cuda.memory.memory_stats(0)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(memory_stats_as_nested_dict=lambda d: NESTED,
                                                            memory_stats=torch.cuda.memory.memory_stats))
    ours = telemetry._counters(fake, 0)
    assert ours and all(flat[k] == v for k, v in ours.items())


def test_unexpected_shape_falls_back_to_memory_stats():
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(memory_stats_as_nested_dict=lambda d: {"x": 1},
                                                            memory_stats=lambda d: {"num_ooms": 7}))
    assert telemetry._counters(fake, 0) == {"num_ooms": 7}


def test_cpu_rank_has_only_host_memory():
    mem = telemetry.read_memory(torch)
    assert mem["host_rss_bytes"] > 0
    assert all(v is None for k, v in mem.items() if k != "host_rss_bytes")
