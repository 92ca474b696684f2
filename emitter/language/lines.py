"""A program's lines as the reader counts them, and its sentences alone: what is made from a program
(an import's weights) is keyed by its sentences, so a comment edited makes nothing again."""

import re

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def program_lines(source):
    """(number, text) of each line, as errors count them (LF, CRLF or a bare CR; no BOM)."""
    source = source.removeprefix("\ufeff")
    return enumerate(source.split("\n") if "\r" not in source else _LINE_BREAK.split(source), start=1)


def sentences_only(source):
    """The program's sentences as the reader reads them (a line stripped; blank ones and those
    starting with `#` are no sentence), without line numbers: two texts alike here are one program."""
    return "\n".join(t for _, x in program_lines(source) if (t := x.strip()) and not t.startswith("#"))
