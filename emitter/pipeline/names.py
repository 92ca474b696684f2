"""What a program's file name becomes in the pipeline's names (tasks, build/ folders, rows): its own
where it is a plain one, else its slug. Apart from the config's reading, so that the report's code
names it alone."""

import re

# A program name becomes a task name (`emit:NAME`), a directory under build/ and a JUnit class name.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
# A file name that is not a plain name goes by its slug: SLUG_PREFIX and the sha256 of the name.
# The `~` is in no plain name, so no slug is a plain name and no two programs share a task name
# (`invalid-<hex>` was itself a plain name: such a program beside the one it was the slug of made
# doit stop the whole run on a duplicated task). `~` is safe in a path component, a doit task name
# (doit refuses only `=`; `:` opens a sub-task), a shell word (not at its start) and a JUnit class
# name (a `.` would split it into a package); names keep the `invalid-` start that tools look for.
SLUG_PREFIX = "invalid-name~"


def slug(name):
    """A program name safe as a task name and a path under build/: the name itself when it is a
    plain one, else SLUG_PREFIX and the whole sha256 of its text (any file name: not UTF-8,
    control characters), so a hostile name still gets its own tasks and error row. One to one: a
    slug is never a plain name, and the hash is of the name's UTF-8 with surrogates passed through
    (the bytes os.listdir could not decode, a lone surrogate), which tells any two names apart; a
    truncated digest would not (12 hex digits collide after ~2**24 tries)."""
    if NAME_RE.fullmatch(name):
        return name
    import hashlib
    return SLUG_PREFIX + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
