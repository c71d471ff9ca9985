"""The Triton kernels (issue 9) against the float64 loop reference.

Without a GPU they run in Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, set before the kernels
are defined), with 16-token tiles so that short rows already cross several tiles. With CUDA the same
checks run on the device at the kernel's real tile size, plus long rows.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest
import torch

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (pip install 'kpo[gpu]')", allow_module_level=True)
if not CUDA:
    # the interpreter must be chosen before triton is first imported (its library functions are jitted then)
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip(
            "triton was imported without TRITON_INTERPRET=1: run this file on its own",
            allow_module_level=True,
        )
    os.environ["TRITON_INTERPRET"] = "1"

from kpo.filter import MASK_MODES, kalman_filter  # noqa: E402
from kpo.filter.dispatch import triton_kernels  # noqa: E402
from kpo.filter.reference import kalman_filter_reference  # noqa: E402

from .helpers import float32_bound, make_mask, make_params  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def small_tiles():
    """16-token tiles in the interpreter, so that short rows already cross several tiles."""
    module = triton_kernels()
    block = module.BLOCK
    if not CUDA:
        module.BLOCK = 16
    yield
    module.BLOCK = block


# (B, T) per case: a single token, a tile boundary, several tiles with a ragged end
SHAPES = [(2, 1), (3, 16), (3, 53)] if not CUDA else [(3, 1), (5, 1024), (7, 5000)]


@pytest.mark.parametrize("mode", MASK_MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_parity(mode, dtype):
    rng = np.random.default_rng(21 + len(mode))
    for B, T in SHAPES:
        for masked in (True, False):
            params = make_params(rng)
            z = torch.from_numpy(rng.normal(0.4, 1.0, (B, T))).to(dtype)
            mask = make_mask(rng, B, T) if masked else None
            if masked:  # the kernels read whole tiles: what lies under the mask must never reach a result
                z = torch.where(mask, z, torch.nan)
            ours = kalman_filter(
                z.to(DEVICE),
                None if mask is None else mask.to(DEVICE),
                **params,
                mask_mode=mode,
                backend="triton",
            )
            ref = kalman_filter_reference(z, mask, mask_mode=mode, **params)
            err = float((ours.cpu().double() - ref).abs().max())
            assert ours.dtype == dtype
            assert err <= (float32_bound(z) if dtype == torch.float32 else 1e-11), (B, T, masked, params)


@pytest.mark.parametrize("mode", MASK_MODES)
def test_backward_matches_torch_path(mode):
    rng = np.random.default_rng(5)
    B, T = SHAPES[-1]
    z = torch.from_numpy(rng.normal(0, 1, (B, T)))
    mask = make_mask(rng, B, T)
    g = torch.where(mask, torch.from_numpy(rng.normal(0, 1, (B, T))), torch.nan)  # never read under the mask
    grads = []
    for backend, device in (("torch", "cpu"), ("triton", DEVICE)):
        leaf = z.to(device).requires_grad_()
        out = kalman_filter(
            leaf, mask.to(device), q=3e-3, v=1.0, p0=0.2, x0=0.1, mask_mode=mode, backend=backend
        )
        (grad,) = torch.autograd.grad((out * g.to(device)).sum(), leaf)
        grads.append(grad.cpu())
    assert float((grads[1] - grads[0]).abs().max()) <= 1e-12
    assert bool((grads[1][~mask] == 0).all())


@pytest.mark.parametrize("mode", MASK_MODES)
def test_backward_is_the_adjoint_of_the_forward(mode):
    # the filter is affine in z, F(z) = A z + F(0), and the backward applies A^T: so <F(z) - F(0), g> must
    # equal <z, A^T g> for any z and g. One forward and one backward per check, where gradcheck would take
    # one forward per input element (minutes in the interpreter); rows cross several tiles and holes.
    rng = np.random.default_rng(6)
    B, T = SHAPES[-1]
    mask = make_mask(rng, B, T).to(DEVICE)
    for _ in range(3):
        z = torch.from_numpy(rng.normal(0, 1, (B, T))).to(DEVICE).requires_grad_()
        g = torch.from_numpy(rng.normal(0, 1, (B, T))).to(DEVICE)
        params = {"q": 2e-2, "v": 1.0, "p0": 0.7, "x0": 0.5, "mask_mode": mode, "backend": "triton"}
        out = kalman_filter(z, mask, **params)
        (dz,) = torch.autograd.grad((out * g).sum(), z)
        offset = kalman_filter(torch.zeros_like(z), mask, **params)
        lhs = float(((out.detach() - offset) * g).sum())
        rhs = float((z.detach() * dz).sum())
        assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs)), (lhs, rhs)


@pytest.mark.skipif(not CUDA, reason="long rows need the GPU (the interpreter is too slow for them)")
@pytest.mark.parametrize(
    ("q", "p0", "mode"), [(1e-8, 0.0, "skip"), (1e-8, 1e4, "advance"), (1e2, 1e4, "zero")]
)
def test_long_rows_on_gpu(q, p0, mode):
    rng = np.random.default_rng(int(q * 1e8) + len(mode))
    T = 131072
    z = torch.from_numpy((0.8 + 0.5 * rng.standard_normal((2, T)) + np.linspace(0, 1, T)).astype(np.float32))
    mask = make_mask(rng, 2, T)
    ours = kalman_filter(
        z.cuda(), mask.cuda(), q=q, v=1.0, p0=p0, x0=-0.3, mask_mode=mode, backend="triton"
    ).cpu()
    ref = kalman_filter_reference(z, mask, q=q, v=1.0, p0=p0, x0=-0.3, mask_mode=mode)
    assert float((ours.double() - ref).abs().max()) <= float32_bound(z)
    # the float32 kernel and the float64 torch path agree to float32 rounding
    torch_path = kalman_filter(
        z.cuda(), mask.cuda(), q=q, v=1.0, p0=p0, x0=-0.3, mask_mode=mode, backend="torch"
    ).cpu()
    assert float((ours - torch_path).abs().max()) <= float32_bound(z)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_kernels_compile_for_hopper_with_vector_accesses(dtype):
    # the interpreter accepts code the compiler rejects (e.g. non-constexpr globals), and it cannot show
    # what the compiler makes of the code: compile every kernel variant for sm_90 (H100/H200) with triton's
    # bundled toolchain, no GPU needed, and check the properties that decide memory throughput
    import json
    import subprocess

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    code = "import sys; from kpo.bench import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, "triton-ptx", "--json", "--dtype", dtype],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("this triton build has no ptxas")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == len(triton_kernels().VARIANTS)
    for row in rows:
        # z (or the incoming gradient) is read and the result written as 16-byte vectors in every variant,
        # the backward's descending tiles included (the gains pass of advance mode reads only the mask)
        assert row["vec st"] >= 1 and (row["vec ld"] >= 1 or row["kernel"] == "advance_gains"), row
    forward = {row["mode"]: row for row in rows if row["kernel"] == "forward"}
    for row in (row for row in rows if row["kernel"] == "backward"):
        assert row["scalar st"] == 0, row
        # the flips that put descending tiles into vector accesses stay within threads: the backward
        # synchronizes no more often than the forward of the same mode
        assert row["bar.sync"] <= forward[row["mode"]]["bar.sync"], (row, forward[row["mode"]])
