"""How often each traced run's allocator history contains its layer template, tensor for tensor (issue 14, eleventh
pass).

For every committed trace (``data/traces/``) the template of its configuration (``memory.gpu.layer_tensors``: with
autograd, and under checkpointing also without, ``NO_GRAD_TEMPLATES``) is expanded, its tensors of 1 MiB or more kept,
and looked for in the training phase's allocations: where the sizes occur in a row, the releases are compared (each
tensor released before the same later tensor; kept ones, and those released past the layer, still live after it).
Prints, per trace and template, the layers whose sizes match, those whose releases match too, and the most frequent
differences as (tensor, template's release, trace's release). A template that matches no layer differs in its sizes
(the first mismatch is printed). ZeRO-3 runs that gather parameters interleave the gathers with the layer and match
few layers.

Usage: python bench/plan/match_templates.py [SRC_ROOT]   (SRC_ROOT: a checkout whose ``src`` to use; default this one)
"""
from __future__ import annotations

import collections
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIB = 2**20


def expanded(layer):
    """The template's tensors of 1 MiB or more: sizes, and releases renumbered among them (None: kept)."""
    large = [i for i, (size, _) in enumerate(layer) if size >= MIB]
    renumber = {i: k for k, i in enumerate(large)}
    sizes = [int(layer[i][0]) for i in large]
    until = [None if layer[i][1] is None else next((renumber[j] for j in large if j >= layer[i][1]), len(large))
             for i in large]
    return sizes, until


def compare(sizes, until, got_sizes, got_until):
    """(layers whose sizes match, whose releases match too, Counter of differences, first size mismatch)."""
    n, matches, exact, diffs = len(sizes), 0, 0, collections.Counter()
    for k in range(len(got_sizes) - n + 1):
        if got_sizes[k:k + n] != sizes:
            continue
        matches += 1
        bad = []
        for j, (want, got) in enumerate(zip(until, got_until[k:k + n])):
            rel = None if got is None else got - k
            if want is None or want >= n:
                ok = rel is None or rel >= n
            else:
                ok = rel == want
            if not ok:
                bad.append((j, want, rel))
        exact += not bad
        diffs.update(bad)
    first = None
    if not matches:
        best = max(range(max(1, len(got_sizes) - n + 1)),
                   key=lambda k: next((j for j in range(n) if k + j >= len(got_sizes) or got_sizes[k + j] != sizes[j]),
                                      n))
        first = next((j for j in range(n) if best + j >= len(got_sizes) or got_sizes[best + j] != sizes[j]), n)
    return matches, exact, diffs, first


def main(argv) -> int:
    root = Path(argv[0]).resolve() if argv else HERE.parents[1]
    sys.path[:0] = [str(root / "src"), str(HERE)]
    # imported first: rows.py puts this checkout's src ahead on the path
    layer_tensors = importlib.import_module("zeropilot.memory.gpu").layer_tensors
    from rows import spec_inputs, step_tensors, traced_runs

    seen = set()
    for r, _, _ in traced_runs():
        trace = r["spec"]["trace"]
        if trace in seen:
            continue
        seen.add(trace)
        inputs = spec_inputs(r["spec"], r["total_gpu_gb"])
        got_sizes, got_until = step_tensors(trace)
        for label, layer in (("autograd", layer_tensors(inputs)), ("no_grad", layer_tensors(inputs, no_grad=True))):
            if layer is None:
                continue
            sizes, until = expanded(layer)
            matches, exact, diffs, first = compare(sizes, until, got_sizes, got_until)
            tail = (f"first size mismatch at tensor {first} of {len(sizes)}" if first is not None
                    else " ".join(f"{d}x{c}" for d, c in diffs.most_common(3)))
            print(f"{trace[:60]:60s} {label:8s} layers {matches:3d} exact {exact:3d}  {tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
