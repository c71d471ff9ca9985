"""The numba path's tiles: masks built around the tile grid (rows shorter than a tile, ends and holes on
and beside tile edges, rows that differ in holes, groups of fewer than four rows), every mode, forward
values and exact gradients against the float64 loop. NaN under the mask must never be read. Threads: the same
bits however rows are split, safe after a fork and from concurrent callers."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from kpo.filter import MASK_MODES, kalman_filter
from kpo.filter.dispatch import compiled
from kpo.filter.reference import kalman_filter_reference

from .helpers import float32_bound, jacobian_product

pytestmark = pytest.mark.skipif(compiled is None, reason="numba is not installed (extra 'fast')")
TILE = compiled.TILE if compiled is not None else 64


def tile_masks(T: int) -> torch.Tensor:
    """bool [11, T]: full, empty, right padding ending on and beside tile edges, holes on tile edges, one
    late hole, a hole in the first tile only (rows then differ in their count of valid tokens)."""
    rows = []
    for length in (T, 0, min(TILE, T), min(TILE - 1, T), min(TILE + 1, T), T - 1, T // 2):
        rows.append(np.arange(T) < length)
    holed = np.ones(T, dtype=bool)
    holed[[t for t in (TILE - 1, TILE, 2 * TILE) if t < T]] = False
    rows.append(holed)
    late = np.ones(T, dtype=bool)
    late[max(0, T - TILE // 2)] = False
    rows.append(late)
    early = np.ones(T, dtype=bool)
    early[: min(3, T)] = [False, True, False][: min(3, T)]
    rows.append(early)
    rows.append(early & (np.arange(T) < T - 5))
    return torch.from_numpy(np.stack(rows))


def nan_where_masked(z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, z, torch.full_like(z, float("nan")))


@pytest.mark.parametrize("T", [1, TILE - 1, TILE, TILE + 1, 3 * TILE + 17])
@pytest.mark.parametrize("mode", MASK_MODES)
def test_tiles_forward_float64_and_float32(T, mode):
    rng = np.random.default_rng(T)
    mask = tile_masks(T)
    z64 = torch.from_numpy(0.7 + rng.normal(0, 1, mask.shape))
    for rows in (slice(None), slice(0, 5), slice(2, 3)):  # 11 rows, a group of 4 + 1, a single row
        z, m = z64[rows], mask[rows]
        for q, p0, x0 in ((1e-6, 0.0, 0.0), (0.3, 2.0, -0.4), (1e2, 1e4, 0.5)):
            ref = kalman_filter_reference(z, m, q=q, v=1.0, p0=p0, x0=x0, mask_mode=mode)
            out = kalman_filter(
                nan_where_masked(z, m), m, q=q, v=1.0, p0=p0, x0=x0, mask_mode=mode, backend="numba"
            )
            assert float((out - ref).abs().max()) <= 1e-11, (rows, q)
            out32 = kalman_filter(
                nan_where_masked(z.float(), m), m, q=q, v=1.0, p0=p0, x0=x0, mask_mode=mode, backend="numba"
            )
            assert float((out32.double() - ref).abs().max()) <= float32_bound(z), (rows, q)
    ref = kalman_filter_reference(z64, q=1e-3, v=1.0, x0=0.2)
    assert (
        float(
            (kalman_filter(z64, None, q=1e-3, v=1.0, p0=0.0, x0=0.2, mask_mode=mode, backend="numba") - ref)
            .abs()
            .max()
        )
        <= 1e-11
    )


@pytest.mark.parametrize("mode", MASK_MODES)
def test_tiles_gradient_is_the_exact_jacobian(mode):
    # affine in z: the float64 loop's response to a unit bump of z[:, j] is column j of the Jacobian
    rng = np.random.default_rng(12)
    T = 2 * TILE + 21
    mask = tile_masks(T)
    B = mask.shape[0]
    z = torch.from_numpy(rng.normal(0, 1, (B, T))).requires_grad_()
    g = torch.from_numpy(rng.normal(0, 1, (B, T))) * mask
    kwargs = {"q": 0.01, "v": 1.0, "p0": 0.3, "x0": 0.2, "mask_mode": mode}
    (grad,) = torch.autograd.grad(
        kalman_filter(z, mask, q=0.01, v=1.0, p0=0.3, x0=0.2, mask_mode=mode, backend="numba"), z, g
    )
    assert float((grad - jacobian_product(z, mask, g, kwargs)).abs().max()) <= 1e-12
    # the outputs at masked tokens are constant 0: NaN upstream gradients there are never read
    (grad_nan,) = torch.autograd.grad(
        kalman_filter(z, mask, q=0.01, v=1.0, p0=0.3, x0=0.2, mask_mode=mode, backend="numba"),
        z,
        nan_where_masked(g, mask),
    )
    assert torch.equal(grad_nan, grad)


@pytest.mark.parametrize("mode", MASK_MODES)
def test_backward_run_of_valid_tiles_stops_at_a_hole(mode):
    # one group of four rows whose top tiles are all valid (the backward runs them back to back) above holes
    # in lower tiles: the run must stop at the first tile holding one (130: row 2), whatever the rows' holes
    rng = np.random.default_rng(14)
    T = 4 * TILE + 9
    mask = torch.ones(4, T, dtype=torch.bool)
    for row, t in ((0, 5), (1, TILE + 6), (2, 3), (2, 2 * TILE + 2)):
        mask[row, t] = False
    z = torch.from_numpy(rng.normal(0, 1, (4, T))).requires_grad_()
    g = torch.from_numpy(rng.normal(0, 1, (4, T))) * mask
    kwargs = {"q": 0.01, "v": 1.0, "p0": 0.3, "x0": 0.2, "mask_mode": mode}
    (grad,) = torch.autograd.grad(kalman_filter(z, mask, backend="numba", **kwargs), z, g)
    assert float((grad - jacobian_product(z, mask, g, kwargs)).abs().max()) <= 1e-12


def test_float32_gradient_is_the_float64_one_rounded_once():
    # the reverse state is float64 whatever the dtype: float32 gradients are float64's rounded once
    rng = np.random.default_rng(13)
    T = 5 * TILE + 3
    mask = tile_masks(T)
    z = torch.from_numpy(rng.normal(0, 1, mask.shape).astype(np.float32))
    g = torch.from_numpy(rng.normal(0, 1, mask.shape).astype(np.float32))
    for mode in MASK_MODES:
        grads = []
        for dtype in (torch.float64, torch.float32):
            leaf = z.to(dtype).requires_grad_()
            (grad,) = torch.autograd.grad(
                kalman_filter(leaf, mask, q=1e-4, v=1.0, p0=0.0, x0=0.0, mask_mode=mode, backend="numba"),
                leaf,
                g.to(dtype),
            )
            grads.append(grad)
        torch.testing.assert_close(grads[1], grads[0].float(), rtol=0, atol=0, msg=mode)


@pytest.mark.parametrize("mode", MASK_MODES)
@pytest.mark.parametrize("B", [1, 5, 37])
def test_threads_split_rows_without_changing_a_bit(mode, B, monkeypatch):
    # rows are cut into ranges that threads take in turn: with tiny ranges (many boundaries, row counts not a
    # multiple of 4, rows of different lengths and holes spread over ranges) the result and the gradient are
    # bit for bit those of one thread, and match the float64 loop
    import kpo.filter.dispatch

    from .helpers import make_mask

    rng = np.random.default_rng(B)
    T = 3 * TILE + 5
    mask = make_mask(rng, B, T)
    z = nan_where_masked(torch.from_numpy(rng.normal(0.3, 1, (B, T))).float(), mask)
    g = nan_where_masked(torch.from_numpy(rng.normal(0, 1, (B, T))).float(), mask)
    results = []
    for threads, min_tokens in ((1, 1 << 15), (2, 1), (2, 7 * T)):
        monkeypatch.setattr(kpo.filter.dispatch, "MIN_CHUNK_TOKENS", min_tokens)
        monkeypatch.setattr(kpo.filter.dispatch, "CHUNKS_PER_THREAD", 3)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            leaf = z.clone().requires_grad_()
            out = kalman_filter(leaf, mask, q=1e-3, p0=0.2, x0=0.1, mask_mode=mode, backend="numba")
            (grad,) = torch.autograd.grad(out, leaf, g)
        finally:
            torch.set_num_threads(before)
        results.append((out.detach(), grad))
    for out, grad in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(grad, results[0][1])
    ref = kalman_filter_reference(z, mask, q=1e-3, p0=0.2, x0=0.1, mask_mode=mode)
    assert float((results[0][0].double() - ref).abs().max()) <= float32_bound(z.nan_to_num())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_filters_on_one_thread(monkeypatch):
    # GNU OpenMP cannot start again in a child forked after the parent used it: numba ends such a child
    # ("fork() called from a process already using GNU OpenMP"). The child takes the serial path instead.
    import kpo.filter.dispatch

    z = torch.from_numpy(np.random.default_rng(0).normal(0, 1, (64, 256))).float()
    monkeypatch.setattr(kpo.filter.dispatch, "MIN_CHUNK_TOKENS", 1)  # ranges of one group: 64x256 runs on threads
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        parent = kalman_filter(z, backend="numba").numpy()  # threads start in the parent
        pid = os.fork()
        if pid == 0:  # only numpy besides the filter here: torch's own thread pool is not fork-safe either
            child = kalman_filter(z, backend="numba").numpy()
            os._exit(0 if (child == parent).all() else 3)
        _, status = os.waitpid(pid, 0)
    finally:
        torch.set_num_threads(before)
    assert os.waitstatus_to_exitcode(status) == 0


_CONCURRENT = """
import numpy as np, torch
from concurrent.futures import ThreadPoolExecutor
import kpo.filter.dispatch
from kpo.filter import kalman_filter

rng = np.random.default_rng(1)
inputs = [torch.from_numpy(rng.normal(0, 1, (64, 256))).float() for _ in range(8)]
torch.set_num_threads(1)
expected = [kalman_filter(z, backend="numba") for z in inputs]  # one thread: the serial path
torch.set_num_threads(2)
kpo.filter.dispatch.MIN_CHUNK_TOKENS = 1
with ThreadPoolExecutor(4) as pool:
    results = list(pool.map(lambda z: kalman_filter(z, backend="numba"), inputs * 8))
assert all(torch.equal(got, want) for got, want in zip(results, expected * 8, strict=True))
import numba
print(numba.threading_layer())
"""


def test_calls_from_two_python_threads_at_once():
    # numba's workqueue layer (the one left where neither OpenMP nor TBB is installed) aborts the process on
    # two parallel launches at once; kpo takes a lock around its launches, so concurrent callers get the
    # serial results. Run in a child on that layer.
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue", "NUMBA_NUM_THREADS": "2"}
    done = subprocess.run(
        [sys.executable, "-c", _CONCURRENT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "workqueue"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_before_any_threads_may_use_them(monkeypatch):
    # only a fork after threads ran pins the child to one thread: a child of a parent that never started
    # them (a fresh worker process) starts its own
    import kpo.filter.dispatch

    monkeypatch.setattr(kpo.filter.dispatch, "_threads_started", False)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, b"1" if kpo.filter.dispatch._forked else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"0"
