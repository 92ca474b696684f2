"""The one error type every refusal of a program, its weights or its config raises."""

MAX_MESSAGE = 4000   # a message quotes a bounded excerpt: a 50 MB line never becomes a 500 MB error


def excerpt(text, limit=160):
    """`text` as at most `limit` printable characters (an ellipsis where it was cut); a character
    that is not printable (a NUL, a line separator) is shown as its escape, `\x00`."""
    if isinstance(text, str) and len(text) <= limit and text.isprintable():
        return text     # (the common case, at C speed: the reader quotes every sentence it reads)
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text)[:limit + 1])
    return text if len(text) <= limit else text[:limit - 1] + "…"


class ProgramError(ValueError):
    """A refusal at a place in a file: `PATH:LINE: message` on the command line.

    `line` is 1-based, or None when the error belongs to a whole file (a weight file of the wrong
    size, say). `path` is filled in by whoever knows the file name (the reader is given text).
    """

    def __init__(self, message, line=None, path=None):
        message = str(message)
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE - 1] + "…"
        super().__init__(message)
        self.message = message
        self.line = line
        self.path = path

    def at(self, path):
        """The same error, naming `path` (kept if already set)."""
        if self.path is None:
            self.path = str(path)
        return self

    def __str__(self):
        where = self.path or "<program>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where}: {self.message}"
