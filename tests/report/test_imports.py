"""`zeropilot report` imports no torch, deepspeed or transformers: it runs anywhere the run directory is."""

import subprocess
import sys
from pathlib import Path

RUN = Path(__file__).resolve().parents[2] / "bench" / "report" / "runs" / "hang-save-rank0-cpu"


def test_report_imports_no_heavy_library(tmp_path):
    code = ("import sys\nfrom zeropilot.cli import main\n"
            f"for fmt in ('text', 'json', 'html'):\n    assert main(['report', {str(RUN)!r}, '--format', fmt, "
            f"'--out', {str(tmp_path / 'r')!r}]) == 0\n"
            "print(sorted(m for m in ('torch', 'deepspeed', 'transformers', 'accelerate', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
