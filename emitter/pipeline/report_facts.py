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


def tally(rows):
    """(programs, checks, failed tasks): a row of a task that failed outside any program (a
    dodo's own) is neither a program nor a check, though its error counts among the verdicts."""
    checks = [r for r in rows if r["check"] != "task"]
    return len({r["name"] for r in checks}), len(checks), len(rows) - len(checks)


def headline(rows):
    """`3 programs, 5 checks — 4 pass, 1 fail, 0 error` (`and 1 failed task` where one did)."""
    c, (programs, checks, tasks) = counts(rows), tally(rows)
    more = f" and {tasks} failed task{'s' if tasks != 1 else ''}" if tasks else ""
    return (f"{programs} program{'s' if programs != 1 else ''}, {checks} check{'s' if checks != 1 else ''}"
            f"{more} — {c['pass']} pass, {c['fail']} fail, {c['error']} error")


def _git(root, *args):
    try:
        p = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


PACKED_REFS_LIMIT = 64 << 20   # characters of .git/packed-refs read (a million refs' worth)


def git_head(root="."):
    """The commit the zoo's checkout is at, read from git's files (no process: a no-op's report key
    holds it, so a report names the commit it is about), or None where it cannot be told so."""
    here = os.path.abspath(root)
    while not os.path.exists(os.path.join(here, ".git")):
        if os.path.dirname(here) == here:
            return None
        here = os.path.dirname(here)
    git = os.path.join(here, ".git")
    try:
        if os.path.isfile(git):   # a worktree or submodule: `gitdir: PATH`
            with open(git, encoding="utf-8") as f:
                git = os.path.join(here, f.read(4096).strip().removeprefix("gitdir: "))
        with open(os.path.join(git, "HEAD"), encoding="utf-8") as f:
            head = f.read(4096).strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        common = git
        if os.path.isfile(os.path.join(git, "commondir")):
            with open(os.path.join(git, "commondir"), encoding="utf-8") as f:
                common = os.path.join(git, f.read(4096).strip())
        for d in dict.fromkeys((git, common)):
            if os.path.isfile(os.path.join(d, ref)):
                with open(os.path.join(d, ref), encoding="utf-8") as f:
                    return f.read(4096).strip()
        with open(os.path.join(common, "packed-refs"), encoding="utf-8") as f:
            packed = f.read(PACKED_REFS_LIMIT + 1)
        if len(packed) > PACKED_REFS_LIMIT:   # (not read whole: the commit is not told)
            return None
        return next((line.split()[0] for line in packed.splitlines() if line.rstrip().endswith(" " + ref)), None)
    except (OSError, UnicodeDecodeError):
        return None


def context(root="."):
    """What the headers say beyond the rows: the zoo's commit (None outside a git checkout) and
    whether the checkout differs from it (a tracked file edited, or a file git does not ignore
    added: a new program's verdict is no commit's), the time (UTC; SOURCE_DATE_EPOCH where set), the host
    and the environment's fingerprint and digest (the one the run's keys use)."""
    from ..verify import environment
    commit = _git(root, "rev-parse", "--verify", "-q", "HEAD")
    dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=normal", "--", ":/",
                      ":(exclude)build")) if commit else False   # (the zoo's build/ is the run's own)
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    try:   # (one that is no time this platform holds, past year 9999 or time_t, is no epoch)
        when = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc) \
            if epoch.isascii() and epoch.isdigit() else None
    except (OverflowError, ValueError, OSError):
        when = None
    when = when or datetime.datetime.now(datetime.timezone.utc)
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
