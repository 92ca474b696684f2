"""The source text of `runtime.py` and `app.py`, read as text (never imported: emission does not
import torch): their import lines and each top-level function or class, verbatim, with the other
definitions it needs."""

import ast
import functools
import re
from dataclasses import dataclass
from importlib import resources

_CALLED = re.compile(r"(?<![.\w])([A-Za-z_]\w*)\(")


@dataclass(frozen=True)
class Source:
    imports: tuple   # the module's import lines, in order
    defs: dict       # name -> source text of a top-level function or class, in file order
    needs: dict      # name -> the names of other top-level definitions its body uses

    def closure(self, names):
        """`names` and every definition they need, in file order."""
        todo, seen = list(names), set()
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self.needs[name])
        return [n for n in self.defs if n in seen]

    def called(self, expression):
        """The definitions a rendered call expression names."""
        return [n for n in _CALLED.findall(expression) if n in self.defs]


@functools.lru_cache(maxsize=None)
def source(module):
    """The Source of `emitter/sambaflow/<module>.py`."""
    text = resources.files(__package__).joinpath(f"{module}.py").read_text(encoding="utf-8")
    tree = ast.parse(text)
    lines = text.encode("utf-8").splitlines(keepends=True)

    def segment(node):   # ast.get_source_segment's text, without splitting the file per node
        part = lines[node.lineno - 1:node.end_lineno]
        part[-1] = part[-1][:node.end_col_offset]
        part[0] = part[0][node.col_offset:]
        return b"".join(part).decode("utf-8")

    imports, defs, nodes = [], {}, {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(segment(node))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defs[node.name] = segment(node)
            nodes[node.name] = node
    needs = {name: sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & set(defs) - {name})
             for name, node in nodes.items()}
    return Source(tuple(imports), defs, needs)
