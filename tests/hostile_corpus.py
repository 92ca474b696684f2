"""A corpus of hostile zoo files: configs and programs as a careless or malicious contributor could
write them. `plant(zoo)` writes every case into a zoo folder beside good programs (files that git
cannot carry, such as non-UTF-8 names, links and 50 MB lines, are made here) and returns
{case: (program row name or None, what its error must say)}. Used by tests/test_hostile.py and
bench/bench_hostile.py."""

import os

import numpy as np

GOOD = "Let x be a 1 by 4 tensor of Real.\nSet item 1 of x to 1.5.\nLet w be a 4 by 4 tensor of Real.\n" \
       "Let h be x matmul w.\nLet y be rmsnorm of h.\n"
SIMPLE = "Let x be a 1 by 4 tensor of Real.\nSet item 1 of x to 1.\nLet y be rmsnorm of x.\n"


def _bomb():
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def plant(zoo, outside):
    """Write the corpus into `zoo` (a repository copy with programs/); `outside` is a folder
    outside it (for links that leave the repository)."""
    p = os.path.join(zoo, "programs")
    w = os.path.join(zoo, "weights")
    os.makedirs(w, exist_ok=True)
    cases = {}

    def program(name, text=SIMPLE, config=None, expect=None, row=None):
        _write(os.path.join(p, f"{name}.logos"), text)
        if config is not None:
            _write(os.path.join(p, f"{name}.yaml"), config)
        cases[name] = (row or name, expect)

    # configs
    program("yaml_bomb", config=_bomb(), expect="programs/yaml_bomb.yaml:1: the config expands (aliases followed) to over 100000 values")
    program("yaml_deep", config="a: " + "[" * 200 + "]" * 200 + "\n", expect="programs/yaml_deep.yaml")
    program("yaml_huge", config="steps: 1\n" + "# padding\n" * 200_000, expect="the config is over 1048576 bytes")
    program("yaml_not_utf8", config=b"steps: 2 # caf\xe9\n", expect="programs/yaml_not_utf8.yaml:1: not UTF-8 text")
    program("yaml_twice", config="steps: 1\nsteps: 3\n", expect="programs/yaml_twice.yaml:2")
    program("yaml_list", config="- 1\n- 2\n", expect="a config is a mapping of keys")
    program("yaml_bad_date", config="steps: 2\nwhen: !!timestamp 2001-13-01\n", expect="programs/yaml_bad_date.yaml: not valid YAML")
    program("yaml_steps", config="steps: 1000000000000000000000000000000\n", expect="steps is over the limit of 100000")
    program("yaml_unknown", config="stepz: 2\n", expect="`stepz`: unknown key")
    program("yaml_python", config="steps: !!python/object/apply:os.system ['echo pwned']\n", expect="programs/yaml_python.yaml:1: not valid YAML")
    program("yaml_stdlib", config="derive: {importer: gguf, checkpoint: 'package:os/__init__.py'}\n",
            expect="no installed distribution ships a package `os`")
    program("yaml_dotdot", config="derive: {importer: gguf, checkpoint: '../../etc/passwd'}\n", expect="leaves the repository")
    program("yaml_weights_out", config="weights: /etc\n", expect="`weights`: `/etc` leaves the repository")
    program("yaml_importer", config="derive: {importer: 'rm -rf', checkpoint: x}\n", expect="`derive.importer`")
    os.symlink(os.path.join(outside, "elsewhere"), os.path.join(w, "yaml_weights_link"))
    os.makedirs(os.path.join(outside, "elsewhere"), exist_ok=True)
    program("yaml_weights_link", config="weights: weights/yaml_weights_link\n", expect="leaves the repository")
    _write(os.path.join(outside, "passwd.yaml"), "steps: 2\n")
    program("yaml_link_out")
    os.symlink(os.path.join(outside, "passwd.yaml"), os.path.join(p, "yaml_link_out.yaml"))
    cases["yaml_link_out"] = ("yaml_link_out", "`programs/yaml_link_out.yaml` is a link that leaves the repository")
    # programs
    _write(os.path.join(outside, "prog.logos"), SIMPLE)
    os.symlink(os.path.join(outside, "prog.logos"), os.path.join(p, "prog_link_out.logos"))
    cases["prog_link_out"] = ("prog_link_out", "`programs/prog_link_out.logos` leaves the repository")
    program("prog_bigdim", "Let x be a 1 by " + "9" * 5000 + " tensor of Real.\nLet y be silu of x.\n",
            expect="programs/prog_bigdim.logos:1:")
    program("prog_huge", "".join(f"Let t{i} be a 40000 by 40000 tensor of Real.\nSet item 1 of t{i} to 1.\n"
                                 for i in range(8)) + "Let y be t0 plus t1.\n",
            expect="over the limit of")
    program("prog_longline", "# " + "a" * 5_000_000 + "\n" + SIMPLE, expect="programs/prog_longline.logos:1: `# aaaa")
    program("prog_not_utf8", SIMPLE.encode() + b"Let z be silu of \xff.\n", expect="programs/prog_not_utf8.logos:4: not UTF-8 text")
    program("prog_nul", SIMPLE + "Let z be silu of y\x00.\n", expect="programs/prog_nul.logos:4:")
    program("prog_inject", SIMPLE + "Let __import__ be silu of y.\n", expect="programs/prog_inject.logos:4:")
    program("prog_inject2", SIMPLE + "Let a;import be silu of y.\n", expect="programs/prog_inject2.logos:4:")
    program("prog_refused_op", SIMPLE + "Let z be selective scan of y.\n",
            expect="`selective scan` has no torch spelling")
    program("prog_empty", "", expect="nothing to compute")
    program("prog_fill_huge", SIMPLE.replace("to 1.", "to 1" + "0" * 400 + "."), expect="programs/prog_fill_huge.logos:2")
    program("prog_index", SIMPLE + "Let z be row 99999999999999999999 of x.\n", expect="programs/prog_index.logos:4")
    program("prog_slow", "Let q be a 400 by 400 tensor of Real.\nSet item 1 of q to 1.\n"
            + "".join(f"Let a{i} be full attention of {'q' if i == 0 else f'a{i - 1}'} over q and q with 1 heads.\n"
                      for i in range(400)),
            config="steps: 1000\nlimits: {seconds: 2}\n", expect="lock check took over 2 s")
    # names
    _write(os.path.join(p, os.fsdecode(b"bad\xffname.logos")), SIMPLE)
    cases["name_not_utf8"] = (None, "is not a plain program name")
    program("ctl\x01name", expect="is not a plain program name")
    cases["ctl\x01name"] = (None, "is not a plain program name")
    program("n" * 200, expect="is not a plain program name")
    cases["n" * 200] = (None, "is not a plain program name")
    # weights
    program("w_dir", GOOD, expect="`w.f64` is not a regular file")
    os.makedirs(os.path.join(w, "w_dir", "w.f64"))
    program("w_size", GOOD, expect="expected 128 bytes of float64, the file has 24")
    _write(os.path.join(w, "w_size", "w.f64"), np.zeros(3).tobytes())
    program("w_nan", GOOD, expect="holds a non-finite value")
    _write(os.path.join(w, "w_nan", "w.f64"), np.full(16, np.nan).tobytes())
    program("w_missing", GOOD, expect="is read but has no declared value")
    os.makedirs(os.path.join(w, "w_missing"))
    program("w_link", GOOD, expect="links outside the weights directory")
    _write(os.path.join(outside, "w.f64"), np.ones(16).tobytes())
    os.makedirs(os.path.join(w, "w_link"))
    os.symlink(os.path.join(outside, "w.f64"), os.path.join(w, "w_link", "w.f64"))
    program("w_st_link", GOOD, expect="`x.safetensors` links outside the weights directory")
    _write(os.path.join(outside, "x.safetensors"), b"not even a header")   # refused, never opened
    _write(os.path.join(w, "w_st_link", "w.f64"), np.ones(16).tobytes())
    os.symlink(os.path.join(outside, "x.safetensors"), os.path.join(w, "w_st_link", "x.safetensors"))
    program("w_loop", GOOD, expect="`w.f64` is not a regular file")   # a link to itself
    os.makedirs(os.path.join(w, "w_loop"))
    os.symlink("w.f64", os.path.join(w, "w_loop", "w.f64"))
    program("ok_loop", GOOD)   # a loop no leaf claims beside its leaf: it passes, the loop ignored
    _write(os.path.join(w, "ok_loop", "w.f64"), np.ones(16).tobytes())
    os.symlink("junk.f64", os.path.join(w, "ok_loop", "junk.f64"))
    # encodings a real editor writes: these pass
    program("ok_bom", "\ufeff" + SIMPLE)
    program("ok_crlf", SIMPLE.replace("\n", "\r\n"))
    program("ok_cr", SIMPLE.replace("\n", "\r"))
    # a renamed program's leftover config
    _write(os.path.join(p, "renamed_away.yaml"), "steps: 2\n")
    return cases
