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


def test_every_op_but_moe_has_a_case():
    from emitter.ops import ALL_OPS
    covered = {read_program(source(c)).stages[0].op.name for c in ALL_CASES}
    assert covered == {op.name for op in ALL_OPS} - {"moe"}
