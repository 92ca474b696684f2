"""`logos doit` as its user types it: the zoo's root found from any folder inside it, doit's
messages naming `logos doit CMD` (doit names its commands after sys.argv[0]: `logos clean` is no
command), and its shell completion rewritten to complete `logos doit …`."""

import io
import os
import sys
from contextlib import redirect_stdout

from .paths import find_zoo_root

BIN_NAME = "logos doit"
_FUNCTION = "logos_doit"    # the completion script's function (a shell name has no space)


def enter_zoo(cwd=None, who=BIN_NAME):
    """chdir to the zoo root (the nearest folder upward holding programs/), saying so on stderr
    (as `who`) when it is not the current folder; the root, or None when there is none."""
    cwd = os.path.abspath(cwd or os.getcwd())
    root = find_zoo_root(cwd)
    if root is not None and root != cwd:
        os.chdir(root)
        print(f"{who}: the zoo at {root} (the nearest folder above {cwd} holding programs/)",
              file=sys.stderr)
    return root


def _bash(script, commands):
    """doit's bash completion for `logos doit …`: the words after `logos` are doit's; at the
    first word, `logos`' own commands; after any other command, file names (`logos check p…`)."""
    shift = (f'''
    # `logos COMMAND`: the first word is logos' command; after `logos doit`, the words are doit's
    if [[ ${{cword}} == 1 ]]; then
        COMPREPLY=( $(compgen -W "{' '.join(commands)}" -- ${{cur}}) )
        return 0
    fi
    if [[ "${{words[1]}}" != "doit" ]]; then
        COMPREPLY=( $(compgen -f -- "${{cur}}") )
        return 0
    fi
    words=("${{words[@]:1}}")
    cword=$((cword - 1))
''')
    anchor = "_get_comp_words_by_ref -n : cur prev words cword\n"
    return script.replace(anchor, anchor + shift, 1).replace(
        f"complete -o filenames -F _{_FUNCTION} {_FUNCTION}", f"complete -o filenames -F _{_FUNCTION} logos")


def _zsh(script, commands):
    """doit's zsh completion for `logos doit …` (the same shift, zsh's way; file names after
    logos' other commands)."""
    shift = (f'''
    if (( CURRENT == 2 )); then
        compadd {' '.join(commands)}
        return
    fi
    if [[ "$words[2]" != doit ]]; then
        _files
        return
    fi
    shift words
    (( CURRENT-- ))
''')
    head = f"_{_FUNCTION}() {{\n"
    return script.replace(f"#compdef {_FUNCTION}", "#compdef logos", 1).replace(head, head + shift, 1)


def tabcompletion(run, argv, commands):
    """doit's `tabcompletion` output, written as `logos doit`'s: `run(argv)` is doit's main."""
    saved, out = sys.argv[0], io.StringIO()
    sys.argv[0] = _FUNCTION   # what doit names the script's function and its `list` calls after
    try:
        with redirect_stdout(out):
            code = run(argv)
    finally:
        sys.argv[0] = saved
    script = out.getvalue().replace(f"$({_FUNCTION} list", f"$({BIN_NAME} list")
    script = script.replace(f"completion for {_FUNCTION}", f"completion for {BIN_NAME}")
    script = script.replace(f"`{_FUNCTION} tabcompletion`", f"`{BIN_NAME} tabcompletion`")
    zsh = "zsh" in argv or "--shell=zsh" in argv
    sys.stdout.write(_zsh(script, commands) if zsh else _bash(script, commands))
    return code
