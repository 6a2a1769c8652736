"""pypto_lab.pto teaches three more mistakes: reading tensor data as a Python value while tracing,
a loop that cannot iterate, and an output the kernel never writes."""

import warnings

import pytest
import torch

import pypto_lab.pto as pypto
from pypto_lab.pto.errors import LoopError, PtoError, ScalarReadError, TileRankError, UnwrittenOutputWarning


def _x():
    torch.manual_seed(0)
    x = torch.randn(64, 64)
    return x, torch.empty_like(x)


# ---- a tensor element read as a Python value --------------------------------------------------------

def _as_float(x):
    return x * float(x[0, 0])


def _as_int(x):
    return x * int(x[0, 0])


def _item(x):
    return x * x[0, 0].item()


def _branch(x):
    return x if x[0, 0] > 0 else x * 2


def _range(x):
    return x * len(range(x[0, 0]))


@pytest.mark.parametrize("read,what", [(_as_float, "float()"), (_as_int, "int()"), (_item, ".item()"),
                                       (_branch, "comparing x[0, 0]"), (_range, "operator.index()")],
                         ids=["float", "int", "item", "if", "range"])
def test_reading_an_element_as_a_python_value_teaches(read, what):
    def kernel(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 32)
        out[:] = read(x)
    with pytest.raises(ScalarReadError) as err:
        pypto.jit(kernel)(*_x())
    msg = str(err.value)
    assert what in msg and "x[0, 0]" in msg                       # what was read
    assert "Rule:" in msg and ("holds no data" in msg or "not data" in msg)  # why it cannot be a value
    assert "Fix:" in msg and "pypto.where(x[0:1, 0:1] > 0, a, b)" in msg  # and the fix
    assert isinstance(err.value, PtoError) and isinstance(err.value, pypto.TraceError)


def test_branching_on_a_computed_tensor_teaches():
    def kernel(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 32)
        if pypto.cond(x[0:1, 0:1] > 0):
            out[:] = x
    with pytest.raises(ScalarReadError, match=r"truth value .* of the result of cmps \(shape \[1, 1\], pypto.DT_BOOL"):
        pypto.jit(kernel)(*_x())


def test_the_suggested_fixes_compute_what_torch_does():
    def scale(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 32)
        out[:] = x * x[0, 0]

    def choose(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 32)
        out[:] = pypto.where(x[0:1, 0:1] > 0, x, x * 2)

    x, out = _x()
    pypto.jit(scale)(x, out)
    assert torch.equal(out, x * x[0, 0])
    pypto.jit(choose)(x, out)
    assert torch.equal(out, x if x[0, 0] > 0 else x * 2)


def test_vector_math_on_a_single_element_teaches():
    def kernel(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 32)
        out[:] = x * pypto.exp(x[0, 0])
    with pytest.raises(TileRankError, match=r"exp on a single element .*Fix: keep a one-element slice .*x\[0:1, 0:1\]"):
        pypto.jit(kernel)(*_x())


# ---- loops that cannot iterate ------------------------------------------------------------------------

def _looping(make_loop):
    def kernel(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 64)
        for i in make_loop():
            i = i[0] if isinstance(i, tuple) else i
            out[i:i + 32, :] = x[i:i + 32, :]
    return pypto.jit(kernel)


@pytest.mark.parametrize("make_loop,found", [
    (lambda: pypto.loop(0, 64, 0), "pypto.loop(0, 64, 0): a step of 0"),
    (lambda: pypto.loop_unroll(0, 64, 0, unroll_list=[2]), "pypto.loop_unroll(0, 64, 0): a step of 0"),
    (lambda: pypto.loop(0, 64.5), "the stop 64.5 is not a whole number"),
    (lambda: pypto.loop(0, 64, 32, 1, 1), "5 bounds given"),
    (lambda: pypto.loop_unroll(0, 64, 32, unroll_list=[0]), "unroll_list [0] holds 0"),
    (lambda: pypto.loop_unroll(64, 0, -32), "the step is negative"),
], ids=["step 0", "unroll step 0", "fractional bound", "too many bounds", "unroll factor 0", "unroll counting down"])
def test_loops_that_cannot_iterate_teach(make_loop, found):
    with pytest.raises(LoopError) as err:
        _looping(make_loop)(*_x())
    msg = str(err.value)
    assert found in msg and "Rule:" in msg and "Fix:" in msg
    assert isinstance(err.value, PtoError)


def test_a_step_of_32_walks_the_tiles():
    x, out = _x()
    _looping(lambda: pypto.loop(0, 64, 32))(x, out)
    assert torch.equal(out, x)


# ---- outputs the kernel does not write ----------------------------------------------------------------

def test_an_argument_never_written_warns_and_keeps_its_values():
    def kernel(x: pypto.Tensor[...], out: pypto.Tensor[...], out2: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 32)
        out[:] = x * 2
    x, out = _x()
    out2 = torch.full_like(x, 7.0)
    with pytest.warns(UnwrittenOutputWarning) as caught:
        pypto.jit(kernel)(x, out, out2)
    msg = str(caught[0].message)
    assert "'out2' (shape [64, 64]) is neither read nor written" in msg and "keeps the values" in msg
    assert "Fix:" in msg and issubclass(UnwrittenOutputWarning, UserWarning)
    assert torch.equal(out2, torch.full_like(x, 7.0)) and torch.equal(out, x * 2)


def test_an_output_written_in_part_warns_naming_the_gap():
    def kernel(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 64)
        for i in pypto.loop(0, 32, 32):  # the loop stops one tile short
            out[i:i + 32, :] = x[i:i + 32, :]
    x, out = _x()
    with pytest.warns(UnwrittenOutputWarning, match=r"'out' \(shape \[64, 64\]\) is written only in part: 2048 of "
                                                    r"4096 elements, the first at index \[32, 0\]"):
        pypto.jit(kernel)(x, out)


def test_a_kernel_that_writes_its_outputs_does_not_warn():
    def kernel(x: pypto.Tensor[...], out: pypto.Tensor[...]):
        pypto.set_vec_tile_shapes(32, 64)
        for i in pypto.loop(0, 64, 32):
            out[i:i + 32, :] = x[i:i + 32, :] + 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnwrittenOutputWarning)
        pypto.jit(kernel)(*_x())
