"""What every view of the report says beside its rows: the counts of verdicts, the warnings (weights
files no leaf claims) and the header's context (commit, time, host, environment). report.py and
report_html.py both read these."""

import datetime
import os
import socket
import subprocess

from ..verify.verdict import short


def counts(rows):
    c = {"pass": 0, "fail": 0, "error": 0}
    for r in rows:
        c[r["verdict"]] = c.get(r["verdict"], 0) + 1
    return c


def _git(root, *args):
    try:
        p = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def context(root="."):
    """What the headers say beyond the rows: the zoo's commit (None outside a git checkout) and
    whether tracked files differ from it, the time (UTC; SOURCE_DATE_EPOCH where set), the host
    and the environment's fingerprint and digest (the one the run's keys use)."""
    from ..verify import environment
    commit = _git(root, "rev-parse", "--verify", "-q", "HEAD")
    dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no")) if commit else False
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    when = (datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc) if epoch.isdigit()
            else datetime.datetime.now(datetime.timezone.utc))
    fp = environment.fingerprint()
    return {"commit": commit, "dirty": dirty, "time": when.strftime("%Y-%m-%dT%H:%M:%S"),
            "hostname": socket.gethostname(), "environment": fp, "environment_digest": environment.digest(fp)}


def warnings(rows):
    """What the report warns of beside the verdicts: files of a program's weights folder that no
    leaf claims (a leaf renamed, a file meant for another program), once per program."""
    seen, out = set(), []
    for r in rows:
        files = [f for f in r.get("unmatched_weights") or () if (r["name"], f) not in seen]
        seen.update((r["name"], f) for f in files)
        out += [f"{short(r['name'])}: weights file `{short(f, 120)}` matches no leaf of the program "
                "(ignored)" for f in files]
    return out
