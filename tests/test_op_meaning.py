"""Every op's VM meaning and emitted torch helper against the independent reference (float64)."""

import numpy as np
import pytest
import torch

from cases import ALL_CASES, draw, expected, source
from conftest import emit_bundle, load_model
from emitter import read_program
from emitter.verify import vm

IDS = [c[0] for c in ALL_CASES]


@pytest.mark.parametrize("case", ALL_CASES, ids=IDS)
def test_vm_matches_reference(case):
    program = read_program(source(case))
    values = draw(case)
    want, want_states = expected(case, values)
    trace = vm.run(program, values)[0]
    np.testing.assert_allclose(trace.output, want, rtol=1e-12, atol=1e-12)
    for name, value in want_states.items():
        np.testing.assert_allclose(trace.states[name], value, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ALL_CASES, ids=IDS)
def test_emitted_helper_matches_reference(case, tmp_path):
    module = load_model(emit_bundle(source(case), tmp_path))
    values = draw(case)
    want, want_states = expected(case, values)
    model = module.LogosModule({k: torch.from_numpy(v) for k, v in values.items()}, torch.float64)
    with torch.no_grad():
        out = model()
    assert out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=1e-12)
    for name, value in want_states.items():
        np.testing.assert_allclose(getattr(model, "leaf_" + name).numpy(), value, rtol=1e-12, atol=1e-12)


def test_every_op_but_the_refused_has_a_case():
    from emitter.ops import ALL_OPS
    covered = {read_program(source(c)).stages[0].op.name for c in ALL_CASES}
    assert covered == {op.name for op in ALL_OPS if op.call is not None}


# ── the epsilon of a norm, a real literal in the sentence ────────────────────────────────────────

NORM_DECLS = ("Let x be a 2 by 4 tensor of Real.\nLet w be a 1 by 4 tensor of Real.\n"
              "Let b be a 1 by 4 tensor of Real.\n")


@pytest.mark.parametrize("word,value", [("1e-5", 1e-5), ("1E-05", 1e-5), ("0.00001", 1e-5),
                                        ("1.0e-12", 1e-12), ("2", 2.0), ("1e+2", 100.0)])
def test_an_epsilon_is_a_decimal_or_scientific_number(word, value):
    for sentence in (f"Let y be rmsnorm of x with weight w across 2 heads with epsilon {word}.",
                     f"Let y be layernorm of x with weight w and bias b with epsilon {word}."):
        assert read_program(NORM_DECLS + sentence).stages[0].bound["EPS"] == value


@pytest.mark.parametrize("word", ["-1e-5", "+1e-5", "0", "0.0", "1e-400", "1e999", ".5", "1.", "1e",
                                  "1e-5e-5", "nan", "inf", "eps", "1_0", "0x10", "1e-1234"])
def test_a_malformed_epsilon_is_refused_at_its_line_with_the_expected_form(word):
    from emitter import ProgramError
    with pytest.raises(ProgramError) as e:
        read_program(NORM_DECLS + f"Let y be rmsnorm of x with epsilon {word}.", path="p.logos")
    assert str(e.value).startswith(f"p.logos:4: `Let y be rmsnorm of x with epsilon {word}.`: `EPS` in "
                                   "`Let OUT be rmsnorm of X [plus R] [with weight W] [across H heads] "
                                   "[with epsilon EPS].` must be a positive finite number written like "
                                   f"`1e-5`, `0.00001` or `1.0e-12`, got `{word}`")


def test_an_epsilon_without_its_number_is_the_forms_error():
    from emitter import ProgramError
    with pytest.raises(ProgramError, match=r"expected `Let OUT be layernorm of X with weight W and bias "
                                           r"B \[with epsilon EPS\]\.`") as e:
        read_program(NORM_DECLS + "Let y be layernorm of x with weight w and bias b with epsilon.")
    assert e.value.line == 4


def test_the_manifest_records_each_norms_epsilon_and_the_call_passes_it():
    import json
    from emitter import emit_program
    program = read_program(NORM_DECLS + "Let y be rmsnorm of x with weight w with epsilon 1e-5.\n"
                           "Let z be layernorm of y with weight w and bias b.\nLet g be exact gelu of z.\n")
    ops = json.loads(emit_program(program).manifest_json)["ops"]
    assert [op.get("eps") for op in ops] == [1e-5, 1e-6, None]
    assert [op["call"] for op in ops] == ["rmsnorm(x, w, 2, 4, 1e-05)", "layernorm(y, w, b, 1e-06)",
                                          "F.gelu(z)"]
