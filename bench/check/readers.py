"""Reading cost of check's readers (issue 13): time against file size, hostile inputs, a tokenizer beside a launch.

    python bench/check/readers.py [--out bench/check/readers.json] [--quick]

1. Time to read against file size, 100 KB -> 10 MB, per reader (JSON, JSON with comments, YAML, shell), on
   files that stay under the value budget (long string values: a config's values are few) and, for JSON and
   YAML, dense files (short values) up to the budget, where reading stops with an input error. Each row gives
   microseconds per KB; linear reading keeps it flat. The previous JSON reader (git d26c543) is timed on
   the small sizes for comparison (it is quadratic: 1 MB took about a minute).
2. Hostile inputs, each in a fresh process: wall time and peak RSS (VmHWM of /proc/self/status; ru_maxrss
   would carry the parent's over exec), next to the same process reading a 1-line config.
3. ``check DIR`` on a launch folder with and without a Qwen2-like tokenizer.json (150k-token vocabulary and
   merges, 8.5 MB) beside its configs: median of 30 library calls (rules already imported) and of 10
   ``python -m zeropilot check DIR`` processes, the two folders interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from zeropilot.errors import InputError  # noqa: E402
from zeropilot.launch.jsonread import read_json  # noqa: E402
from zeropilot.launch.shell import parse_script  # noqa: E402
from zeropilot.launch.yamlread import parse_yaml  # noqa: E402

SIZES = [100_000, 300_000, 1_000_000, 3_000_000, 10_000_000]
OLD_SIZES = [100_000, 200_000, 400_000]


def sparse_json(size: int, comments: bool = False) -> str:
    """A config-shaped JSON of about ``size`` bytes: nested sections, 400-character string values."""
    parts, i = [], 0
    while sum(len(p) for p in parts) < size:
        note = "  // a note\n" if comments else ""
        parts.append(f'{note}  "section_{i}": {{"path": "{"p" * 400}", "stage": {i % 4}, "on": true}},\n')
        i += 1
    return "{\n" + "".join(parts) + '  "last": 1\n}\n'


def dense_json(size: int) -> str:
    return "[" + ",".join(["1"] * (size // 2)) + "]"


def sparse_yaml(size: int) -> str:
    parts, i = [], 0
    while sum(len(p) for p in parts) < size:
        parts.append(f"section_{i}:\n  path: {'p' * 400}\n  stage: {i % 4}\n")
        i += 1
    return "".join(parts)


def script(size: int) -> str:
    line = "deepspeed --num_gpus 8 train.py --deepspeed ds.json --output_dir " + "o" * 300 + "\n"
    return "#!/bin/bash\nexport A=1\n" + line * (size // len(line))


def old_json_reader():
    """The reader before issue 13 (quadratic line counting), loaded from git."""
    source = subprocess.run(["git", "show", "d26c543:src/zeropilot/launch/jsonread.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    module = types.ModuleType("old_jsonread")
    exec(compile(source, "old_jsonread.py", "exec"), module.__dict__)  # noqa: S102 - our own history
    return module.parse_json


def timed(fn, text: str, runs: int) -> dict:
    times, outcome = [], "read"
    for _ in range(runs):
        t0 = time.perf_counter()
        try:
            fn(text, Path("bench"))
        except InputError as exc:
            outcome = "refused: " + exc.reason[:60]
        times.append(time.perf_counter() - t0)
    best = min(times)
    return {"bytes": len(text), "seconds": round(best, 4), "us_per_kb": round(best / len(text) * 1e9, 2),
            "outcome": outcome}


def scaling(quick: bool) -> dict:
    sizes = SIZES[:3] if quick else SIZES
    readers = {
        "json (sparse)": (read_json, sparse_json), "json with comments (sparse)":
            (read_json, lambda n: sparse_json(n, comments=True)),
        "json (dense, until the value budget)": (read_json, dense_json),
        "yaml (sparse)": (parse_yaml, sparse_yaml), "yaml (dense, until the value budget)": (parse_yaml, dense_json),
        "shell script": (parse_script, script),
    }
    out = {name: [timed(fn, make(n), 3) for n in sizes] for name, (fn, make) in readers.items()}
    old = old_json_reader()
    out["json (sparse), previous reader d26c543"] = [timed(old, sparse_json(n), 1) for n in OLD_SIZES]
    return out


HOSTILE = {
    "baseline (1-line config)": "read_json('{\"a\": 1}', P)",
    "billion laughs yaml (342 B)": "parse_yaml(LOL, P)",
    "7 MB single-line json list": "read_json('[' + '1,' * 3_500_000 + '1]', P)",
    "7 MB single-line yaml list": "parse_yaml('[' + '1,' * 3_500_000 + '1]', P)",
    "7 MB single-line json string": "read_json('{\"a\": \"' + 'x' * 7_000_000 + '\"}', P)",
    "7 MB single-line yaml string": "parse_yaml('a: ' + 'x' * 7_000_000, P)",
    "7 MB single-line shell command": "parse_script('deepspeed t.py ' + '--a 1 ' * 1_200_000, P)",
    "7 MB of shell continuations": "parse_script('deepspeed x.py \\\\\\n' * 400_000, P)",
    "7 MB shell line, open quote": "parse_script(\"echo '\" + 'x' * 7_000_000, P)",
    "7 MB shell script of short words": "parse_script(('echo ' + 'w ' * 1000 + '\\n') * 3500, P)",
    "5000-digit integer json": "read_json('{\"a\": ' + '9' * 5000 + '}', P)",
    "5000-digit integer yaml": "parse_yaml('a: ' + '9' * 5000, P)",
    "python 1+1+... (400 KB)": "parse_python('x = ' + '1+' * 200_000 + '1', P)",
    "python ----1 (200 KB)": "parse_python('x = ' + '-' * 200_000 + '1', P)",
    "python a.b.b... (400 KB)": "parse_python('x = a' + '.b' * 200_000, P)",
}
PRELUDE = """
import sys, time
sys.path[:0] = [{src!r}]
from pathlib import Path
from zeropilot.errors import InputError
from zeropilot.launch.jsonread import read_json
from zeropilot.launch.yamlread import parse_yaml
from zeropilot.launch.shell import parse_script
from zeropilot.launch.pyread import parse_python
P = Path('hostile')
LOL = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\\n' + ''.join(
    f'{{n}}: &{{n}} [' + ','.join([f'*{{p}}'] * 9) + ']\\n' for p, n in zip('abcdefgh', 'bcdefghi'))
t0 = time.perf_counter()
try:
    {expr}
    outcome = 'read'
except InputError as exc:
    outcome = 'refused: ' + exc.reason[:70]
hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0]  # ru_maxrss survives exec
print(time.perf_counter() - t0, hwm, outcome, sep='\\t')
"""


def hostile() -> dict:
    out = {}
    for name, expr in HOSTILE.items():
        code = PRELUDE.format(src=str(ROOT / "src"), expr=expr)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            out[name] = {"error": proc.stderr.strip().splitlines()[-1]}
            continue
        seconds, rss_kb, outcome = proc.stdout.strip().split("\t")
        out[name] = {"seconds": round(float(seconds), 3), "peak_rss_mib": round(int(rss_kb) / 1024, 1),
                     "outcome": outcome}
    return out


def tokenizer_folder() -> dict:
    from tests.conftest import write_files
    from tests.launch.test_readers_bounded import qwen2_like_tokenizer
    from zeropilot.check import check

    launch = {"ds.json": {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"},
              "train.yaml": "model_name_or_path: Qwen/Qwen2-7B\ndeepspeed: ds.json\noutput_dir: out\n",
              "run.sh": "FORCE_TORCHRUN=1 NPROC_PER_NODE=4 llamafactory-cli train train.yaml\n"}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        plain = write_files(Path(tmp) / "plain", launch)
        beside = write_files(Path(tmp) / "with_tokenizer", {**launch, "tokenizer.json": qwen2_like_tokenizer()})
        out["tokenizer_json_bytes"] = (beside / "tokenizer.json").stat().st_size
        check([plain], use_installed=False)  # rule modules imported once, as in one CLI run
        folders = (("without tokenizer.json", plain), ("with tokenizer.json", beside))
        calls = {name: [] for name, _ in folders}
        cli = {name: [] for name, _ in folders}
        for _ in range(30):  # interleaved: the machine's load moves both alike
            for name, folder in folders:
                t0 = time.perf_counter()
                result, _ = check([folder], versions="deepspeed=0.19.8", use_installed=False)
                calls[name].append(time.perf_counter() - t0)
        for _ in range(10):
            for name, folder in folders:
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "zeropilot", "check", str(folder)], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
                cli[name].append(time.perf_counter() - t0)
        for name, folder in folders:
            result, _ = check([folder], versions="deepspeed=0.19.8", use_installed=False)
            out[name] = {"check_call_median_s": round(statistics.median(calls[name]), 5),
                         "cli_median_s": round(statistics.median(cli[name]), 4), "files_read": len(result.files),
                         "skipped": [Path(f).name for f, _ in result.skipped],
                         "read_errors": len(result.read_errors)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench" / "check" / "readers.json"))
    ap.add_argument("--quick", action="store_true", help="sizes up to 1 MB only")
    args = ap.parse_args()
    result = {
        "command": "python bench/check/readers.py" + (" --quick" if args.quick else ""),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "scaling": scaling(args.quick),
        "hostile": hostile(),
        "tokenizer_beside_launch": tokenizer_folder(),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
