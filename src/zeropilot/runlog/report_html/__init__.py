"""``zeropilot report --format html``: one self-contained page per run (or per pair of runs).

- :mod:`downsample`: min/max per bucket, so peaks survive any run length.
- :mod:`svg`: the chart primitives, every text escaped.
- :mod:`charts`: memory per rank over time, all ranks together, step time.
- :mod:`sections`: verdict, OOM, hang, saves, event log, environment as HTML.
- :mod:`page`: the document (no script, a CSP that forbids loading anything) and the compare page.
"""

from zeropilot.runlog.report_html.page import render, render_compare

__all__ = ["render", "render_compare"]
