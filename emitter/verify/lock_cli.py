"""`logos lock BUNDLE --program P [--weights W] [--dtype D] ...`: one lock check by hand, its
RESULT.json written (an `unfinished` error until the verdict replaces it), golden/ beside the
bundle's files, and the verdict's line; exit 0 pass, 1 fail, 2 error (emitter.verify.lock)."""

import os
import sys

from .. import fingerprint
from ..files import own_folder, private, streamed, unwritable, write_files
from ..lifetime import die_with, ended, leave
from ..ops.precision import parse_policy
from . import verdict
from .lock import lock_bundle
from .result import unfinished, write_result
from .threads import DEFAULT_THREADS, MAX_THREADS, thread_limits
from .tolerances import DEFAULT_TOLERANCES as TOLERANCES, tolerance


def write_golden(bundle_dir, files):
    """golden/'s files (lock_bundle's `golden_files`) into the bundle, whole or not at all (into a
    folder of its own: a link there is removed, never written through)."""
    own_folder(os.path.join(bundle_dir, "golden"))
    write_files(os.path.join(bundle_dir, "golden"), files)


EXIT = {"pass": 0, "fail": 1, "error": 2}


def add_arguments(p):
    p.add_argument("bundle", help="bundle directory (model.py, manifest.json, compile.py)")
    p.add_argument("--program", required=True, help="PROGRAM.logos the bundle was emitted from")
    p.add_argument("--weights", help="directory of the leaves' files: <var>.f64 / .f32 / .npy, or "
                   ".safetensors files of tensors named by variable")
    p.add_argument("--dtype", default="float64", choices=sorted(TOLERANCES),
                   help="the module's dtype (default float64)")
    p.add_argument("--steps", type=int, default=1, help="steps of the program, states carried (default 1)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default by dtype)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default by dtype)")
    p.add_argument("--allow-nonfinite", action="append", default=[], metavar="LEAF",
                   help="a leaf whose file may hold NaN or Inf (repeatable)")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help=f"torch's and the BLAS's threads (default {DEFAULT_THREADS}: see "
                        "emitter/verify/threads.py)")
    p.add_argument("--precision", action="append", default=[], metavar="OP=COMPUTE,OUTPUT",
                   help="the program's bf16 precision policy, as its config's `precision:` "
                        "(repeatable; e.g. sigmoid=fp32,fp32): the bundle's PRECISION must be it")
    p.add_argument("-o", "--out", required=True, help="RESULT.json")


# the dtypes `compile.py test` runs on CPU: a lock by hand records each one's default tolerance
# beside the one it applied, so that the bundle tests itself at either after any lock
TESTED = ("float32", "float64")
ZOO_RECORD = os.path.join("build", ".fingerprints.json")   # a zoo's hash record, from its root


def zoo_record():
    """The hash record of the zoo this folder lies in (build/.fingerprints.json here or in a
    folder above), or None; only a build/ that is this user's and no one else's to write: one
    found above the cwd may lie in a shared folder, where anyone could have put hashes of other
    bytes. (A zoo's own run trusts its build/ whatever its mode, as it trusts its results.)"""
    here = os.getcwd()
    while True:
        if os.path.isfile(os.path.join(here, ZOO_RECORD)):
            return os.path.join(here, ZOO_RECORD) if private(os.path.join(here, "build")) else None
        up = os.path.dirname(here)
        if up == here:
            return None
        here = up


def apart(run):
    """(run(), None, the pid it ran in) computed in a forked child (which dies with this process),
    so that a bundle ending its process (os._exit, a crash, an exit handler of its own) ends the
    child alone; (None, why, pid) where it ended before its value came back, or where what
    escaped the check was no exception a check can be (GeneratorExit).
    A KeyboardInterrupt (Ctrl-C, or the bundle raising one) is raised here. Where fork is not
    there, run() here."""
    if not hasattr(os, "fork"):
        return run(), None, os.getpid()
    import pickle
    import signal
    r, w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:   # the child: its value (or what escaped) through the pipe, then os._exit
        os.close(r)
        try:
            die_with(parent)   # (a SIGTERM or SIGKILL of `logos lock` ends its check too)
            before = fingerprint.snapshot(findings=True)
            try:
                body = pickle.dumps(("done", run(), fingerprint.added_since(before)), pickle.HIGHEST_PROTOCOL)
            except BaseException as e:   # (the bundle's KeyboardInterrupt, GeneratorExit)
                body = pickle.dumps(("raised", type(e).__name__, str(e)), pickle.HIGHEST_PROTOCOL)
            with os.fdopen(w, "wb") as out:
                out.write(body)
        finally:
            leave(0)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as f:
            body = f.read()
        status = os.waitpid(pid, 0)[1]
    except BaseException:   # (Ctrl-C here: the child goes with it)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    try:
        reply = pickle.loads(body)
    except Exception:
        return None, (f"the lock check's process {ended(status)} before its verdict (the bundle's own exit, "
                      "or a crash in a native call)"), pid
    if reply[0] == "raised":
        if reply[1] == "KeyboardInterrupt":
            raise KeyboardInterrupt
        return None, f"the lock check raised {reply[1]}: {reply[2]}", pid
    fingerprint.merge(reply[2])
    return reply[1], None, pid


def main(args):
    if not 1 <= args.threads <= MAX_THREADS:
        print(f"--threads must be from 1 to {MAX_THREADS}, got {args.threads}", file=sys.stderr)
        return 2
    try:
        policy = parse_policy(args.precision)
    except ValueError as e:
        print(f"--precision: {e}", file=sys.stderr)
        return 2
    problem = unwritable(args.out)
    if problem:   # said before the lock runs, not after (its verdict would be lost)
        print(f"-o {args.out}: {problem}", file=sys.stderr)
        return 2
    try:   # (until the verdict replaces it: a process ended mid-way leaves no earlier verdict there;
        # a FIFO or a terminal gets the verdict alone)
        if not streamed(args.out):
            write_result(unfinished(args.bundle, args.program, args.weights, args.dtype, args.steps,
                                    args.atol, args.rtol), args.out)
    except (OSError, ValueError, KeyError) as e:
        print(f"-o {args.out}: not written: {e}", file=sys.stderr)
        return 2
    record = zoo_record()
    if record:   # run inside a zoo: a weights file it hashed is not read again
        fingerprint.bind(record)
    def check():
        golden = {}
        return lock_bundle(args.bundle, args.program, args.weights, args.dtype, args.steps, args.atol,
                           args.rtol, tuple(args.allow_nonfinite), golden_files=golden, precision=policy,
                           golden={args.dtype: tolerance(args.dtype, args.atol, args.rtol)}), golden
    with thread_limits(args.threads) as threads:
        done, ended, ran_in = apart(check)
    if done is None:   # no verdict came back: an error that says how its process ended
        r, golden = unfinished(args.bundle, args.program, args.weights, args.dtype, args.steps, args.atol,
                               args.rtol), {}
        r["reason"] = ended
    else:
        r, golden = done
    r["execution"] = {"executor": "logos lock", "pid": ran_in, **threads}
    try:
        write_result(r, args.out)
    except OSError as e:
        print(f"{r['name']} [{r['steps']} step(s)] {verdict.line(r)}", file=sys.stderr)
        print(f"-o {args.out}: not written: {e.strerror or e}", file=sys.stderr)
        return 2
    for line in verdict.unmatched(args.weights, r.get("unmatched_weights") or ()):
        print(line, file=sys.stderr)
    if golden:   # beside the bundle's files, for `python compile.py test`
        from .golden import merged
        try:
            write_golden(args.bundle, merged(args.bundle, golden, {d: tolerance(d) for d in TESTED}))
        except OSError as e:
            print(f"{args.bundle}: golden/ not written: {e}", file=sys.stderr)
    print(f"{r['name']} [{r['steps']} step(s)] {verdict.line(r)}",
          file=sys.stderr if r["verdict"] != "pass" else sys.stdout)
    if r["verdict"] == "fail" and r.get("raised"):   # the line names the stage; this, the exception
        print(r["reason"], file=sys.stderr)
    return EXIT[r["verdict"]]
