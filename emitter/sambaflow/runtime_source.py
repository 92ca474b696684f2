"""The source text of `runtime.py`, `weight_files.py` and `app.py`, read as text (never imported:
emission does not import torch): their import lines and each top-level function or class (and,
asked, constant), verbatim, with the other definitions it needs. A relative import is how the real
module reaches what the emitter copies beside it (runtime.py's weight_files functions): it is
not one of the import lines."""

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

    def used_by(self, text):
        """The definitions named in `text` (another module's function, say)."""
        return sorted({n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)} & set(self.defs))

    def called(self, expression):
        """The definitions a rendered call expression names."""
        return [n for n in _CALLED.findall(expression) if n in self.defs]


@functools.lru_cache(maxsize=None)
def source(module, constants=False):
    """The Source of `emitter/sambaflow/<module>.py`; with `constants`, its top-level assignments
    to one name are definitions too (runtime.py's are emitted per program instead)."""
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
            if not getattr(node, "level", 0):
                imports.append(segment(node))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defs[node.name] = segment(node)
            nodes[node.name] = node
        elif constants and isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            defs[node.targets[0].id] = segment(node)
            nodes[node.targets[0].id] = node
    needs = {name: sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & set(defs) - {name})
             for name, node in nodes.items()}
    return Source(tuple(imports), defs, needs)
