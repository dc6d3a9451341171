"""Write the HTML report of a run directory and a PNG of it taken by headless Chromium (for docs/).

    python bench/report/screenshot.py RUN_DIR docs/report-cpu.png [--height 1500] [--compare DIR2]

The PNG is the top ``--height`` pixels of the page at 1280 px wide (the whole page without it);
the HTML is written beside the PNG's name with ``.html`` unless ``--html`` says where.
"""

from __future__ import annotations

import argparse
import struct
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.report import browser  # noqa: E402
from zeropilot.cli import main as zeropilot  # noqa: E402


def crop_png(png: bytes, height: int) -> bytes:
    """The top ``height`` rows of an 8-bit RGB(A) PNG, re-encoded (no imaging library needed)."""
    pos, chunks = 8, []
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        chunks.append((kind, png[pos + 8:pos + 8 + n]))
        pos += 12 + n
    ihdr = dict(chunks)[b"IHDR"]
    width, old_h, depth, color = struct.unpack(">IIBB", ihdr[:10])
    if depth != 8 or color not in (2, 6) or height >= old_h:
        return png
    raw = zlib.decompress(b"".join(d for k, d in chunks if k == b"IDAT"))
    row = 1 + width * (4 if color == 6 else 3)
    new_ihdr = struct.pack(">II", width, height) + ihdr[8:]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return png[:8] + chunk(b"IHDR", new_ihdr) + chunk(b"IDAT", zlib.compress(raw[:row * height], 9)) + \
        chunk(b"IEND", b"")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--height", type=int)
    ap.add_argument("--html", type=Path)
    ap.add_argument("--compare", type=Path)
    args = ap.parse_args()
    html = args.html or Path(tempfile.mkdtemp(prefix="zp-shot-")) / "report.html"
    extra = ["--compare", str(args.compare)] if args.compare else []
    if zeropilot(["report", str(args.run_dir), "--format", "html", "--out", str(html), *extra]) != 0:
        return 1
    with browser.Browser(timeout=120) as b:
        seen = b.visit(html, "document.title")
    if seen.console_errors or [u for u in seen.requests if u != html.resolve().as_uri()]:
        print(f"page problems: {seen.console_errors} {seen.requests}", file=sys.stderr)
        return 1
    png = crop_png(seen.screenshot, args.height) if args.height else seen.screenshot
    args.png.write_bytes(png)
    print(f"{args.png}: {len(png) // 1024} KiB; page {html} ({html.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
