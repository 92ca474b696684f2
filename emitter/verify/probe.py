"""The lock's probe pass: the module's `tap` hook, which compares each stage's value with the VM's
and hands the VM's value on, so each op is judged on the VM's inputs."""

import time

import numpy as np

from ..ops import release
from .compare import EXACT, compare, same_in_dtype, worse


class CouldNotRun(Exception):
    """The lock could not compare at all (bad program, weights, bundle, or a module that raises)."""


class Probe:
    """The module's `tap` hook in the probe pass: compare each stage with the VM, hand back the VM's."""

    def __init__(self, torch, dtype, vm_stages, tol, precisions=None, views=()):
        self.torch, self.dtype, self.vm_stages, self.tol, self.views = torch, dtype, vm_stages, tol, views
        self.precisions = precisions   # bf16: each stage's (compute, output); its values are kept
        self.results, self.values = {}, {}
        self.last = -1
        self.seconds = 0.0  # spent comparing and converting: the lock's, not the module's

    def out_dtype(self, index):
        """The dtype a stage's value goes on in: the lock's, or under bf16 its output precision."""
        if self.precisions is not None:
            return self.torch.float32 if self.precisions[index][1] == "fp32" else self.torch.bfloat16
        return self.dtype

    def to_torch(self, value, index):
        return self.torch.from_numpy(np.ascontiguousarray(value, dtype=np.float64)).to(self.out_dtype(index))

    def __call__(self, index, value):
        start = time.perf_counter()
        try:
            return self._compare(index, value)
        finally:
            self.seconds += time.perf_counter() - start

    def _compare(self, index, value):
        want = self.vm_stages[index]
        if isinstance(want, tuple):
            got = tuple(value) if isinstance(value, (tuple, list)) else (value,)
            if len(got) != len(want):
                raise CouldNotRun(f"stage {index} returned {len(got)} values, expected {len(want)}")
            m = None
            for g, w in zip(got, want):
                m = worse(m, compare(g.detach(), w, self.tol))
            back = tuple(self.to_torch(w, index) for w in want)
            kept = got[0]
        else:
            if isinstance(value, (tuple, list)):
                raise CouldNotRun(f"stage {index} returned {len(value)} values, expected one")
            if index in self.views and same_in_dtype(value.detach(), want):
                # a view computes nothing: the VM's, rounded as the module holds its operand (the
                # load stage's rule), is all there is to check, and the module's own goes on
                self.results[index], self.last = dict(EXACT, view=True), index
                return value
            m = compare(value.detach(), want, self.tol)
            # exactly the VM's in the dtype it goes on in: its own (a transposed table is not copied)
            same = m["max_abs"] == 0 and m["nonfinite_mismatch"] == 0 and value.dtype == self.out_dtype(index)
            back = value if same else self.to_torch(want, index)
            release(want)
            kept = value
        if self.precisions is not None:
            self.values[index] = kept.detach().double().numpy()
        self.results[index] = m
        self.last = index
        return back
