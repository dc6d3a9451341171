"""Downsampling for display keeps every bucket's extremes: a one-step spike is never smoothed away."""

from __future__ import annotations

import math
from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from zeropilot.runlog.report_html.downsample import bucket_index, minmax


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e12, 1e12), st.just(math.nan)), min_size=1, max_size=400),
       st.integers(1, 50))
def test_each_bucket_keeps_its_min_and_max_in_order(ys, buckets):
    xs = array("d", range(len(ys)))
    ys = array("d", ys)
    index = bucket_index(xs, 0.0, float(len(ys) - 1), buckets)
    out = minmax(xs, ys, index, buckets)
    assert [x for x, _ in out] == sorted(x for x, _ in out)
    assert len(out) <= 2 * buckets
    for b in range(buckets):
        vals = [y for i, y in zip(index, ys) if i == b and not math.isnan(y)]
        kept = [y for x, y in out if index[int(x)] == b]
        if vals:
            assert min(vals) in kept and max(vals) in kept
        else:
            assert kept == []


def test_a_single_spike_in_100k_points_survives():
    n = 100_000
    xs = array("d", range(n))
    ys = array("d", [1.0] * n)
    ys[77_777] = 50.0
    out = minmax(xs, ys, bucket_index(xs, 0.0, n - 1.0, 700), 700)
    assert len(out) <= 1400 and (77_777.0, 50.0) in out
