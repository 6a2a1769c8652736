"""The event simulator: in-order pipes, parallel pipes, flags, and its invariants."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_lab.hw.simulator import PingPong, Program, simulate, simulate_arrays


def test_same_pipe_runs_in_order_and_different_pipes_in_parallel():
    p = Program()
    a = p.emit(0, "MTE2", 10, "load")
    b = p.emit(0, "MTE2", 5, "load")
    c = p.emit(0, "CUBE", 7, "mmad")
    tl = simulate(p)
    assert (tl.start[a], tl.end[a]) == (0, 10)
    assert (tl.start[b], tl.end[b]) == (10, 15)     # waits for the MTE2 pipe
    assert (tl.start[c], tl.end[c]) == (0, 7)       # another pipe: runs at once
    assert tl.total_cycles == 15
    assert tl.pipe_busy(0)["MTE2"] == 15 and tl.pipe_busy(0)["CUBE"] == 7


def test_wait_flag_delays_the_consumer_until_the_producer_ends():
    p = Program()
    load = p.emit(0, "MTE2", 10, "load")
    p.set_flag(0, "MTE2", "CUBE", 0, load)
    mm = p.emit(0, "CUBE", 4, "mmad", (p.wait_flag(0, "MTE2", "CUBE", 0),))
    tl = simulate(p)
    assert tl.start[mm] == 10 and tl.total_cycles == 14


def test_a_transfer_frees_its_pipe_before_its_data_arrives():
    p = Program()
    first = p.emit(0, "MTE2", 10, "load", latency=300)   # pipe busy 10 cycles, data after 300
    second = p.emit(0, "MTE2", 10, "load", latency=300)
    use = p.emit(0, "CUBE", 5, "mmad", (first,))
    tl = simulate(p)
    assert tl.start[second] == 10                          # the pipe issues the next transfer
    assert tl.ready[first] == 300 and tl.start[use] == 300  # the consumer waits for the data
    assert tl.total_cycles == 310 and tl.pipe_busy(0)["MTE2"] == 20


def test_cores_are_independent():
    p = Program()
    p.emit(0, "CUBE", 10, "mmad")
    p.emit(1, "CUBE", 10, "mmad")
    tl = simulate(p)
    assert tl.total_cycles == 10 and tl.busy.shape == (2, 7)


def test_a_forward_dependency_is_rejected():
    with pytest.raises(ValueError, match="only wait for an instruction issued before it"):
        simulate_arrays(np.zeros(2, np.int32), np.zeros(2, np.int8), np.ones(2),
                        np.array([0, 1, 1]), np.array([1]))


def test_double_buffer_overlaps_load_and_compute():
    def run(slots):
        p = Program()
        buf = PingPong(slots)
        for _ in range(8):
            slot, free = buf.acquire()
            ld = p.emit(0, "MTE2", 10, "load", (free,))
            v = p.emit(0, "VECTOR", 10, "compute", (ld,))
            st_ = p.emit(0, "MTE3", 10, "store", (v,))
            buf.release(slot, st_)
        return simulate(p)

    single, double = run(1), run(2)
    assert single.total_cycles == 8 * 30                    # copy-in, compute, copy-out in series
    assert double.total_cycles < 0.6 * single.total_cycles  # loads overlap compute
    # without ping-pong the Vector unit is busy a third of the time
    assert single.pipe_busy(0)["VECTOR"] / single.total_cycles == pytest.approx(1 / 3)


@st.composite
def programs(draw):
    n = draw(st.integers(1, 60))
    pipes = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    cores = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    durs = draw(st.lists(st.floats(0, 100, allow_nan=False), min_size=n, max_size=n))
    deps = [sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=3)))) if i else [] for i in range(n)]
    return cores, pipes, durs, deps


def _arrays(cores, pipes, durs, deps):
    ptr = np.cumsum([0] + [len(d) for d in deps]).astype(np.int64)
    idx = np.array([j for d in deps for j in d], np.int64)
    return (np.array(cores, np.int32), np.array(pipes, np.int8), np.array(durs, np.float64), ptr, idx)


@settings(max_examples=150, deadline=None)
@given(programs())
def test_schedule_invariants(prog):
    cores, pipes, durs, deps = prog
    start, end, busy, total = simulate_arrays(*_arrays(cores, pipes, durs, deps), n_cores=3)
    assert np.all(end - start == pytest.approx(np.array(durs)))
    for i, d in enumerate(deps):
        for j in d:
            assert start[i] >= end[j]                  # a wait_flag is honoured
    for lane in {(c, p) for c, p in zip(cores, pipes)}:
        idx = [i for i in range(len(pipes)) if (cores[i], pipes[i]) == lane]
        for a, b in zip(idx, idx[1:]):
            assert start[b] >= end[a]                  # in order, one at a time per pipe
    assert total == pytest.approx(max(end))
    assert busy.sum() == pytest.approx(sum(durs))


@settings(max_examples=100, deadline=None)
@given(programs(), st.data())
def test_longer_instructions_never_finish_sooner(prog, data):
    cores, pipes, durs, deps = prog
    i = data.draw(st.integers(0, len(durs) - 1))
    longer = list(durs)
    longer[i] += data.draw(st.floats(0, 50, allow_nan=False))
    t0 = simulate_arrays(*_arrays(cores, pipes, durs, deps), n_cores=3)[3]
    t1 = simulate_arrays(*_arrays(cores, pipes, longer, deps), n_cores=3)[3]
    assert t1 >= t0 - 1e-9
