"""Benchmark build/report.html for a zoo of many passing programs: how large the page is and how long
headless Chromium takes to render it.

    python bench/bench_report.py [--programs 1000] [--repeat 3] [--keep DIR]

The zoo is synthetic (tests/report_zoo.py: each program's emit status and results written and keyed
as the pipeline does, three checks each), its rows made by report.build_rows and its files by
report.write_reports. Chromium's time is the median wall time of a headless screenshot of the page
less that of an empty page (Chromium's own start); `pdf_pages` is the page's length as Chromium
prints it. Target (issue 26): 1,000 passing programs stay a short page. Prints one JSON object.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from report_zoo import FLAGS, pdf_pages, synthetic_rows  # noqa: E402
from emitter.pipeline.report import write_reports  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _shot(url, out):
    t = time.perf_counter()
    subprocess.run([CHROMIUM, *FLAGS, "--window-size=1000,1600", f"--screenshot={out}", url],
                   capture_output=True, timeout=600, check=True)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep")
    args = ap.parse_args()
    if not CHROMIUM:
        sys.exit("bench_report: Chromium is needed (`bash setup.sh --tests` installs Debian's chromium)")
    work = args.keep or tempfile.mkdtemp(prefix="bench-report-")
    try:
        t = time.perf_counter()
        rows = synthetic_rows(os.path.join(work, "zoo"), args.programs)
        rows_s = time.perf_counter() - t
        build = os.path.join(work, "build")
        t = time.perf_counter()
        write_reports(rows, build, os.path.join(build, ".report-plots.json"))
        write_s = time.perf_counter() - t
        page = os.path.join(build, "report.html")
        blank = os.path.join(work, "blank.html")
        with open(blank, "w") as f:
            f.write("<!DOCTYPE html><html><body></body></html>\n")
        shot = os.path.join(work, "shot.png")
        empty = statistics.median(_shot("file://" + blank, shot) for _ in range(args.repeat))
        full = statistics.median(_shot("file://" + page, shot) for _ in range(args.repeat))
        pdf = os.path.join(work, "report.pdf")
        subprocess.run([CHROMIUM, *FLAGS, "--no-pdf-header-footer", f"--print-to-pdf={pdf}", "file://" + page],
                       capture_output=True, timeout=600, check=True)
        from pathlib import Path
        print(json.dumps({
            "programs": args.programs, "checks": len(rows),
            "report_html_kb": round(os.path.getsize(page) / 1024, 1),
            "junit_xml_kb": round(os.path.getsize(os.path.join(build, "junit.xml")) / 1024, 1),
            "chromium_render_s": round(full - empty, 3), "chromium_page_s": round(full, 3),
            "chromium_empty_s": round(empty, 3), "pdf_pages": pdf_pages(Path(pdf)),
            "rows_s": round(rows_s, 3), "write_reports_s": round(write_s, 3)}))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
