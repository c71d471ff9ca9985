"""Pure-torch path of the filter (any device): per-token gains, then a chunked linear scan.

With data-independent gains the filter is the first-order linear recurrence
    x_t = keep_t * x_{t-1} + gain_t * y_t          (keep = 1 - gain; skipped tokens: keep 1, gain 0)
whose backward is the same recurrence run in reverse. T is cut into chunks of up to CHUNK tokens (WIDE_CHUNK
in the positional forward where the cumsum accumulates in a wider type than the data: float32 on CPU). Each
chunk is scanned from 0 in the input's dtype, all chunks of all rows at once: when every row takes the
positional gains (no mask, right padding, ``zero`` mode, and ``skip`` mode with holes once each row's valid
tokens are moved left) as a cumsum of weighted z, rescaled per token by cached factors, in the output buffer
itself; otherwise (``advance`` mode with holes: per-row gains) by CHUNK vectorized steps. The state entering
each chunk is an exact float64 scan over chunks, recursive in chunks of chunks, so the Python steps grow as
CHUNK log_CHUNK T. The rescaling is by inverse products of keeps within one chunk only, at most MAX_UNSCALE
(chunks shorten where the keeps are small); the authors divide by the product over the whole response, which
overflows.

Precision: the float32 forward is a convex combination of the carry and the chunk's z with weights kept to
float32's relative precision (gains, not 1 - gain, are rounded), so its error stays a few ulps of
max(|z|, |x0|) whatever T; the carries never leave float64. The backward computes in float64.
"""

from __future__ import annotations

import functools
import math

import torch

from kpo.filter.gains import gain_tensors

_F64 = torch.float64
# tokens per chunk scanned in the compute dtype: float32 rounding grows with it (~CHUNK/2 ulps at worst)
CHUNK = 32
# tokens per chunk of the positional forward where the cumsum accumulates in a wider type than the data
# (torch's CPU cumsum adds float32 in float64): its rounding then does not grow with the chunk, and longer
# chunks leave fewer ends to gather and a smaller carry product (256x4096: 0.88 -> 0.65 ms). At most 1/16
# of the table's tokens, so padding T to whole chunks wastes at most ~1/8
WIDE_CHUNK = 256
# chunks whose carries one dense product computes ([B, 256] @ [256, 257]: T up to 8192 at CHUNK tokens, 65536
# at WIDE_CHUNK; one product beats the blocks below in Python steps); beyond, blocks of CHUNK chunks
MAX_CHUNKS_IN_ONE_PRODUCT = 256
# blocks of CHUNK chunks whose carries one dense product computes (64: T up to 65536 in one product of
# [B, 64] @ [64, 65]); beyond, the recursive carry scan
MAX_BLOCKS_IN_ONE_PRODUCT = 64


def advance_gains(mask: torch.Tensor, q: float, v: float, p0: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (gain, keep), float64 [B, T], of ``advance`` mode for bool [B, T] ``mask``: a masked token
    gets gain 0 and keep 1 (no observation; its time step only grows the variance of the tokens after it).

    The posterior variance steps are Moebius maps with non-negative 2x2 matrices: an update
    P -> v(P+q)/(P+q+v) is U = [[v, vq], [1, q+v]], h holes P -> P+hq are [[1, hq], [0, 1]]. Within a run of
    valid tokens the posterior before the k-th is U^k (cached powers) applied to the run's first one; from
    run to run that first posterior moves by [[1, hq], [0, 1]] U^len (len: the run's length, h: the holes
    after it), composed by a doubling scan over runs: log2 of the most runs in a row steps, not log2 T, on
    [B, runs] entries, not [B, T]. Every product is rescaled to entries summing to 1 (the same map, finite
    entries); non-negative entries mean no cancellation.
    """
    B, T = mask.shape
    t = torch.arange(T, device=mask.device).expand(B, T)
    start = mask.clone()
    start[:, 1:] &= ~mask[:, :-1]
    run = _running_count(start).sub_(1)  # each valid token's run, counted from 0 in its row
    R = int(run[:, -1].max()) + 1  # runs in the row that has the most
    if R == 0:  # nothing valid
        gain = torch.zeros(B, T, dtype=_F64, device=mask.device)
        return gain, torch.ones_like(gain)
    # first position and length of each run, [B, R]; column R takes what belongs to no run
    first = torch.zeros(B, R + 1, dtype=torch.long, device=mask.device)
    first = first.scatter_(1, torch.where(start, run, R), t)[:, :R]
    length = torch.zeros(B, R + 1, dtype=torch.long, device=mask.device)
    length = length.scatter_add_(1, torch.where(mask, run, R), torch.ones_like(run))[:, :R]
    holes = first.clone()  # before each run (the rows' unused runs: none)
    holes[:, 1:] -= first[:, :-1] + length[:, :-1]
    holes.clamp_(min=0)
    powers = _update_powers(q, v, _table_size(T + 1), mask.device)  # U^0 .. U^T at least
    # maps[:, :, r]: run r's first posterior from run 0's, composed left to right by doubling
    shift_by = holes[:, 1:].to(_F64) * q
    one, zero = torch.ones_like(shift_by), torch.zeros_like(shift_by)
    maps = _compose(torch.stack([one, shift_by, zero, one]), powers[:, length[:, :-1]])
    shift = 1
    while shift < R - 1:
        maps[:, :, shift:] = _compose(maps[:, :, shift:], maps[:, :, :-shift])
        shift *= 2
    head = p0 + q * holes[:, :1].to(_F64)  # run 0's first posterior
    firsts = torch.cat([head, (maps[0] * head + maps[1]) / (maps[2] * head + maps[3])], dim=1)
    at = run.clamp(min=0)
    place = (t - first.gather(1, at)).clamp_(min=0).view(-1)  # k: each token's place in its run
    a, b, c, d = (torch.index_select(entry, 0, place).view(B, T) for entry in powers)  # U^k
    base = firsts.gather(1, at)
    # the posterior before each token is (a base + b) / (c base + d), its prior that + q: with D = c base + d
    # and N = a base + b + q D, gain = N / (N + v D) and keep = v D / (N + v D), sums of non-negative terms
    den = c.mul_(base).add_(d)
    num = a.mul_(base).add_(b).add_(den, alpha=q)
    total = torch.add(num, den, alpha=v)
    masked = ~mask
    return num.div_(total).masked_fill_(masked, 0.0), den.mul_(v).div_(total).masked_fill_(masked, 1.0)


def _table_size(n: int) -> int:
    """The power of two >= n a cached table is built for: every n up to it slices the same table."""
    return 1 << max(0, n - 1).bit_length()


def _running_count(flags: torch.Tensor) -> torch.Tensor:
    """How many of bool [B, T] ``flags`` are set up to each position, int64 [B, T]: through the uint8 view and
    an in-place cumsum, 0.7 ms at 256x4096 where torch.cumsum of the bools took 2.2 (0.4 vs 0.7 warm)."""
    return flags.view(torch.uint8).long().cumsum_(1)


def _any_masked(mask: torch.Tensor | None) -> torch.Tensor | None:
    """``mask``, or None where it is None or every token is valid (a byte reduction: ~30x faster than
    mask.all(), and the positional route then needs no masking)."""
    return None if mask is None or bool(mask.view(torch.uint8).min()) else mask


def right_padded(mask: torch.Tensor) -> bool:
    """Whether every row of bool [B, T] ``mask`` is valid tokens then padding (nothing valid after a hole).

    A hole then a valid token is a step of +1 between neighbours. As int8 the steps are one vectorized
    subtraction and a max: 0.04 ms at 256x4096, against 0.25 for the same test as bool comparisons."""
    if mask.shape[1] < 2:
        return True
    values = mask.view(torch.int8)
    return int(torch.sub(values[:, 1:], values[:, :-1]).max()) <= 0


def _normalized(m: torch.Tensor) -> torch.Tensor:
    """Moebius matrices, float64 [4, ...] entries (a, b, c, d), rescaled to entries summing to 1."""
    return m / m.sum(dim=0)


def _compose(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The Moebius maps x after y, [4, ...] entries (a, b, c, d) of each matrix: x @ y, ``_normalized``."""
    return _normalized(
        torch.stack(
            [
                x[0] * y[0] + x[1] * y[2],
                x[0] * y[1] + x[1] * y[3],
                x[2] * y[0] + x[3] * y[2],
                x[2] * y[1] + x[3] * y[3],
            ]
        )
    )


@functools.lru_cache(maxsize=8)
def _update_powers(q: float, v: float, n: int, device: torch.device) -> torch.Tensor:
    """U^k for k = 0..n-1 (n a power of two), U = [[v, vq], [1, q+v]] the posterior variance update:
    float64 [4, n], entries (a, b, c, d), ``_normalized``; by doubling (log2 n products)."""
    powers = torch.empty(4, n, dtype=_F64, device=device)
    powers[:, 0] = torch.tensor([0.5, 0.0, 0.0, 0.5], dtype=_F64)
    if n > 1:
        powers[:, 1] = _normalized(torch.tensor([v, v * q, 1.0, q + v], dtype=_F64))
    size = 2
    while size < n:
        top = _compose(powers[:, size // 2 : size // 2 + 1], powers[:, size // 2 : size // 2 + 1])  # U^size
        powers[:, size : 2 * size] = _compose(top, powers[:, :size])
        size *= 2
    return powers


def chunked_scan(
    keep: torch.Tensor, y: torch.Tensor, x0: float, gain: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scan along dim 1 from x_{-1} = x0 -> (x [B, T] in y's dtype, x_{T-1} float64 [B]).

    With ``gain``: x_t = x_{t-1} + gain_t (y_t - x_{t-1}) (the filter; keep = 1 - gain);
    without:       x_t = keep_t x_{t-1} + y_t           (the reverse scan of the backward).
    keep, gain: float64 [B, T]; y: [B, T] float32 or float64, the compute dtype. (Rows with per-row gains:
    ``advance`` mode with holes; the positional gains take ``_positional_scan``.)

    Chunks of ``CHUNK`` tokens are scanned from 0 in y's dtype, all chunks of all rows at once (CHUNK Python
    steps); the chunk-to-chunk carries are an exact float64 scan over chunks (``_carry_scan``); each token
    then adds its chunk's carry times the float64 product of keeps since the chunk start.
    """
    B, T = y.shape
    L = min(CHUNK, T)
    n = -(-T // L)
    pad = n * L - T
    if pad:
        keep = torch.nn.functional.pad(keep, (0, pad), value=1.0)
        y = torch.nn.functional.pad(y, (0, pad), value=0.0)
        if gain is not None:
            gain = torch.nn.functional.pad(gain, (0, pad), value=0.0)
    dtype = y.dtype
    # [L, B, n]: step i reads one contiguous slab holding token i of every chunk of every row
    y3 = y.reshape(B, n, L).permute(2, 0, 1).contiguous()
    step = (keep if gain is None else gain).reshape(B, n, L).permute(2, 0, 1).to(dtype).contiguous()
    local = torch.empty_like(y3)
    local[0] = y3[0] if gain is None else step[0] * y3[0]
    for i in range(1, L):
        if gain is None:
            torch.addcmul(y3[i], step[i], local[i - 1], out=local[i])
        else:
            # lerp: x + g (y - x) keeps the gain's relative precision (1 - g in float32 would round it)
            torch.lerp(local[i - 1], y3[i], step[i], out=local[i])
    decay = torch.cumprod(keep.reshape(B, n, L), dim=2)  # float64 [B, n, L], products since chunk start
    carry, x_end = _carry_scan(decay[:, :, L - 1], local[L - 1].to(_F64), x0)
    out = torch.empty(B, n * L, dtype=dtype, device=y.device)
    torch.addcmul(
        local,
        decay.permute(2, 0, 1).to(dtype),
        carry.to(dtype).unsqueeze(0),
        out=out.view(B, n, L).permute(2, 0, 1),
    )
    return (out[:, :T].contiguous() if pad else out), x_end


def _carry_scan(keep: torch.Tensor, inc: torch.Tensor, x0: float) -> tuple[torch.Tensor, torch.Tensor]:
    """States before each step of x_j = keep_j x_{j-1} + inc_j from x_{-1} = x0, float64.

    keep: [rows, N] (rows 1 or B), inc: [B, N] -> (before [B, N], state after the last step [B]).
    Recursive over chunks of CHUNK steps, so the Python steps grow as CHUNK log_CHUNK N, not with N.
    """
    B, N = inc.shape
    rows = keep.shape[0]
    if N <= CHUNK:
        before = torch.empty_like(inc)
        state = torch.full((B,), float(x0), dtype=_F64, device=inc.device)
        for j in range(N):
            before[:, j] = state
            state = torch.addcmul(inc[:, j], keep[:, j], state)
        return before, state
    L = CHUNK
    n = -(-N // L)
    pad = n * L - N
    if pad:
        keep = torch.nn.functional.pad(keep, (0, pad), value=1.0)
        inc = torch.nn.functional.pad(inc, (0, pad), value=0.0)
    k3, i3 = keep.reshape(rows, n, L), inc.reshape(B, n, L)
    after = torch.empty(B, n, L, dtype=_F64, device=inc.device)
    after[:, :, 0] = i3[:, :, 0]
    for i in range(1, L):
        after[:, :, i] = torch.addcmul(i3[:, :, i], k3[:, :, i], after[:, :, i - 1])
    decay = torch.cumprod(k3, dim=2)
    carry, x_end = _carry_scan(decay[:, :, L - 1], after[:, :, L - 1].clone(), x0)
    after.addcmul_(decay, carry.unsqueeze(2))
    before = torch.cat([carry.unsqueeze(2), after[:, :, : L - 1]], dim=2)
    return before.reshape(B, n * L)[:, :N], x_end


def forward(z, mask, mode, q, v, p0, x0):
    """Filter of z [B, T] (float32/64) in z's dtype -> (out, 0 at masked; final states [B], float64)."""
    mask = _any_masked(mask)
    if mask is None:
        return _positional_scan(z, x0, q, v, p0)
    if right_padded(mask):
        # masked z reach only the states after each row's last valid token, which the mask zeroes: z goes
        # in unmasked (one pass fewer) unless a non-finite z somewhere, perhaps under the mask (never to be
        # read), makes a final state non-finite
        x, x_end = _positional_scan(z, x0, q, v, p0)
        if not math.isfinite(float(x_end.sum())):
            x, x_end = _positional_scan(torch.where(mask, z, 0.0), x0, q, v, p0)
        return x.masked_fill_(~mask, 0.0), x_end
    y = torch.where(mask, z, 0.0)  # a masked z is never read (it may be NaN)
    if mode == "zero":  # a masked token is an observation of 0: the positional gains still serve every row
        x, x_end = _positional_scan(y, x0, q, v, p0)
    elif mode == "skip":  # a masked token takes no step: the valid tokens moved left are right-padded rows
        rank, slot = _skip_slots(mask)
        x, x_end = _positional_scan(_compact(y, slot), x0, q, v, p0)
        x = x.gather(1, rank)
    else:  # advance: gains differ per row (holes), the stepwise chunked scan
        gain, keep = advance_gains(mask, q, v, p0)
        x, x_end = chunked_scan(keep, y, x0, gain)
    return x.masked_fill_(~mask, 0.0), x_end


def _skip_slots(mask):
    """For skip mode's compaction of bool [B, T] ``mask``: (rank: each valid token's index among its row's
    valid tokens, where its state lies in the compacted row; slot: the same, but the last column for masked
    tokens, which holds padding in every row that has a masked token), int64 [B, T]."""
    rank = _running_count(mask).sub_(1).clamp_(min=0)
    return rank, torch.where(mask, rank, mask.shape[1] - 1)


def _compact(t, slot):
    """t [B, T] (0 at masked tokens) with each row's valid entries moved left in order, zeros after."""
    return torch.zeros_like(t).scatter_(1, slot, t)


def _positional_scan(y, x0, q, v, p0):
    """The filter of y [B, T] (z with masked tokens as the caller wants them) when every row takes the
    positional gains -> (states [B, T] in y's dtype, unmasked; states after the last chunk [B], float64,
    non-finite iff a y is).

    Within a chunk, with after_k the product of the keeps of the chunk's tokens after token k, the state
    after token i is
        x_i = (carry * the chunk's product of keeps + sum over k <= i of gain_k after_k y_k) / after_i,
    so one broadcast product, an in-place cumsum along each chunk, then (once the float64 carries over chunks
    are known, ``_chunk_carries``) an in-place add and multiply give every state in one [B, T] buffer: the
    output itself. A second [B, T] buffer (a chunk-major batched product, then a transposing pass) costs
    about as much when memory is warm, but both fresh buffers pay page faults where the allocator has
    returned them to the system: 3x slower at 256x4096 in a plain loop on the README's machine.
    """
    B, T = y.shape
    weight, unscale, chunk_keep = _positional_factors(q, v, p0, T, y.device, y.dtype)
    n, L = weight.shape
    if n * L != T:
        y = torch.nn.functional.pad(y, (0, n * L - T))
    x = torch.mul(y.view(B, n, L), weight)
    x.cumsum_(2)  # the chunk's own part of each state, times after_i (the chunk's last state: after = 1)
    carry, x_end = _chunk_carries(x[:, :, L - 1].to(_F64), q, v, p0, L, x0)
    x.add_((carry * chunk_keep).to(y.dtype).unsqueeze(2)).mul_(unscale)
    return (x.view(B, n * L) if n * L == T else x.view(B, n * L)[:, :T].contiguous()), x_end


def _positional_factors(q, v, p0, T, device, dtype):
    """(weight, unscale: [n, L] in dtype, chunk_keep: float64 [n]) for T tokens in n chunks of L (see
    ``_positional_scan``): gain_k after_k, 1 / after_i, and each chunk's product of keeps."""
    weight, unscale, chunk_keep = _positional_factor_table(q, v, p0, _table_size(T), device, dtype)
    n = -(-T // weight.shape[1])
    return weight[:n], unscale[:n], chunk_keep[:n]


# the largest 1 / after_k a chunk may hold: weights gain_k after_k below float32's normal range (2^-126) then
# lose at most 2^-149 * 2^64 of a z's unit, far below the float32 contract
MAX_UNSCALE = 2.0**64


def _chunk_length(keep, longest):
    """Tokens per chunk for the positional keeps, float64 [tokens] (a power of two): ``longest`` (a power of
    two), halved while some chunk's product of keeps after its first token is below 1 / MAX_UNSCALE (keeps
    far below 1, e.g. q >> v, need shorter chunks; L = 1 always fits). Both directions rescale by these
    products' inverses."""
    L = min(longest, keep.numel())
    while L > 1 and float(keep.view(-1, L)[:, 1:].prod(dim=1).min()) * MAX_UNSCALE < 1.0:
        L //= 2
    return L


@functools.lru_cache(maxsize=8)
def _positional_factor_table(q, v, p0, tokens, device, dtype):
    """``_positional_factors`` for a power of two of tokens, in chunks of ``_chunk_length``."""
    gain, keep = gain_tensors(tokens, q, v, p0, device, _F64)
    longest = min(WIDE_CHUNK, max(CHUNK, tokens // 16)) if _cumsum_is_wide(device, dtype) else CHUNK
    L = _chunk_length(keep, longest)
    k = keep.view(-1, L)
    # after[:, i]: the keeps of the chunk's tokens i+1..L-1 (1 for the last), products only
    after = torch.ones_like(k)
    after[:, :-1] = k[:, 1:].flip(1).cumprod(1).flip(1)
    weight = gain.view(-1, L) * after  # each token's weight in its chunk's last state (they sum to < 1)
    return weight.to(dtype), (1.0 / after).to(dtype), (k[:, 0] * after[:, 0]).contiguous()


@functools.cache
def _cumsum_is_wide(device, dtype) -> bool:
    """Whether torch's in-place cumsum of ``dtype`` on ``device`` accumulates in a wider type: then
    2/eps + 1 + 1 - 2/eps comes out 2, not 0 (2/eps + 1 rounds to 2/eps in dtype). Probed once per device and
    dtype, not assumed, on rows of WIDE_CHUNK as ``_positional_scan`` calls it (a kernel may pick its route by
    shape)."""
    big = 2.0 / torch.finfo(dtype).eps
    probe = torch.zeros(2, 2, WIDE_CHUNK, dtype=dtype, device=device)
    probe[..., :4] = torch.tensor([big, 1.0, 1.0, -big], dtype=dtype)
    return bool((probe.cumsum_(2)[..., -1] == 2.0).all())


def _chunk_carries(ends, q, v, p0, L, x0):
    """States entering each chunk of positional gains, float64 [B, n], and the state after the last [B].

    ends: float64 [B, n], each chunk's last state scanned from 0. The carries are linear in them with maps
    shared by all rows: up to MAX_CHUNKS_IN_ONE_PRODUCT chunks one product does them all; beyond, one
    batched product does every block of CHUNK chunks (Python steps: one per block, not one per chunk), then
    a carry scan over the blocks.
    """
    B, n = ends.shape
    size = _table_size(n)
    if n <= MAX_CHUNKS_IN_ONE_PRODUCT:
        across, from_x0 = _dense_carry_table(q, v, p0, size, L, ends.device)
        states = _states_from(ends, across[:n, : n + 1], from_x0[: n + 1], x0)
        return states[:, :n], states[:, n]
    G = CHUNK
    nb = -(-n // G)
    maps, decay, block_keep, across, from_x0 = _carry_map_table(q, v, p0, size, L, ends.device)
    maps, decay, block_keep = maps[:nb], decay[:nb], block_keep[:nb]
    if nb * G != n:
        ends = torch.nn.functional.pad(ends, (0, nb * G - n))
    parts = torch.bmm(ends.view(B, nb, G).transpose(0, 1), maps)  # [nb, B, G + 1]
    if across is not None:  # few blocks: the carries over them in one product, not a loop
        states = _states_from(parts[:, :, G].T, across[:nb, : nb + 1], from_x0[: nb + 1], x0)
        block_in, x_end = states[:, :nb], states[:, nb]
    else:
        block_in, x_end = _carry_scan(block_keep.unsqueeze(0), parts[:, :, G].T, x0)
    before = torch.addcmul(parts[:, :, :G], decay.unsqueeze(1), block_in.T.unsqueeze(2))  # [nb, B, G]
    return before.transpose(0, 1).reshape(B, nb * G)[:, :n], x_end


def _states_from(ends, across, from_x0, x0):
    """The states entering m steps and after the last, float64 [B, m + 1], from their increments ends [B, m]
    and ``_carry_weights``' (across [m, m + 1], from_x0 [m + 1]): ends @ across + x0 from_x0. The default
    x0 = 0 adds nothing (addmm's broadcast add took 0.03 of its 0.08 ms at 256x4096)."""
    states = torch.mm(ends, across)
    if x0:
        states.add_(from_x0, alpha=x0)
    return states


def _carry_weights(keeps):
    """Weights of x_i = keeps_i x_{i-1} + inc_i over m steps: keeps float64 [..., m] -> (across [..., m, m + 1]:
    the weight of inc_j in the state before step i (column m: after the last), i.e. the keeps of steps
    j+1..i-1; start [..., m + 1]: the weight of the state before step 0 there). Built by the recurrence
    itself: products only, nothing divided."""
    *lead, m = keeps.shape
    across = keeps.new_zeros(*lead, m, m + 1)
    start = keeps.new_ones(*lead, m + 1)
    for i in range(1, m + 1):
        across[..., : i - 1, i] = across[..., : i - 1, i - 1] * keeps[..., i - 1 : i]
        across[..., i - 1, i] = 1.0
        start[..., i] = start[..., i - 1] * keeps[..., i - 1]
    return across, start


def _chunk_keeps(q, v, p0, n, L, device):
    """Each chunk's product of keeps, float64 [n], for n chunks of L positional tokens."""
    _, keep = gain_tensors(n * L, q, v, p0, device, _F64)
    return torch.cumprod(keep.view(n, L), dim=1)[:, L - 1]


@functools.lru_cache(maxsize=8)
def _dense_carry_table(q, v, p0, n, L, device):
    """``_carry_weights`` of n chunks of L positional tokens: (across [n, n + 1], from_x0 [n + 1])."""
    return _carry_weights(_chunk_keeps(q, v, p0, n, L, device))


@functools.lru_cache(maxsize=8)
def _carry_map_table(q, v, p0, n, L, device):
    """Maps of the carries over n chunks of L positional tokens, in blocks of CHUNK chunks, float64:
    (maps [nb, G, G + 1]: the states entering each chunk of block b from 0 and after its last chunk =
    chunk ends @ maps[b]; decay [nb, G]: keeps from the block's start to each chunk; block_keep [nb];
    across [nb, nb + 1] and from_x0 [nb + 1], or None for more than MAX_BLOCKS_IN_ONE_PRODUCT blocks: the
    states entering each block = block ends @ across + x0 * from_x0)."""
    G = CHUNK
    nb = -(-n // G)
    chunk_keep = torch.ones(nb * G, dtype=_F64, device=device)
    chunk_keep[:n] = _chunk_keeps(q, v, p0, n, L, device)
    maps, through = _carry_weights(chunk_keep.view(nb, G))
    decay, block_keep = through[:, :G].contiguous(), through[:, G].contiguous()
    across = from_x0 = None
    if nb <= MAX_BLOCKS_IN_ONE_PRODUCT:
        across, from_x0 = _carry_weights(block_keep)
    return maps, decay, block_keep, across, from_x0


def backward(grad, mask, mode, q, v, p0):
    """Gradient w.r.t. z of sum(grad * filter(z)), summed in float64: the reverse scan
    u_t = w_t + keep_{t+1} u_{t+1}, dz_t = gain_t u_t."""
    mask = _any_masked(mask)
    w = grad if mask is None else torch.where(mask, grad, 0.0)
    if mask is None or mode == "zero" or right_padded(mask):  # the positional gains serve every row
        dz = _positional_reverse_scan(w, q, v, p0)
    elif mode == "skip":  # the forward's compaction, transposed
        rank, slot = _skip_slots(mask)
        dz = _positional_reverse_scan(_compact(w, slot), q, v, p0).gather(1, rank)
    else:
        gain, keep = advance_gains(mask, q, v, p0)
        keep_next = torch.nn.functional.pad(keep[:, 1:], (0, 1), value=1.0)
        u, _ = chunked_scan(keep_next.flip(1), w.to(_F64).flip(1), 0.0)
        dz = (gain * u.flip(1)).to(grad.dtype)
    return dz if mask is None else dz.masked_fill_(~mask, 0.0)


def _positional_reverse_scan(w, q, v, p0):
    """dz [B, T] in w's dtype of the backward when every row takes the positional gains; the sums in float64.

    Within a chunk, with before_i the product of the keeps of the chunk's tokens 1..i (1 at i = 0), the
    reverse state is
        u_i = (sum over k >= i of before_k w_k + before_{L-1} keep_next u_next) / before_i,   dz_i = gain_i u_i,
    with keep_next, u_next the keep and the reverse state of the next chunk's first token. So: a broadcast
    product, a product with a triangular matrix of ones for the suffix sums, the reverse carries over chunks
    (one product up to MAX_CHUNKS_IN_ONE_PRODUCT chunks, else a float64 scan), then an add and a multiply in
    place and the cast to w's dtype. The chunks are the forward's (the same inverse products, at most
    MAX_UNSCALE).
    """
    B, T = w.shape
    weight, unscale, chunk_keep, across = _positional_back_factors(q, v, p0, T, w.device)
    n, L = weight.shape
    if n * L != T:
        w = torch.nn.functional.pad(w, (0, n * L - T))
    # a float64 copy scaled in place, then the float64 result cast: a mixed-dtype product takes twice as long
    weighted = w.view(B, n, L).to(_F64, copy=True).mul_(weight)
    sums = torch.mm(weighted.view(B * n, L), _suffix_sum_matrix(L, w.device)).view(B, n, L)
    heads = sums[:, :, 0]  # u at each chunk's first token, from the chunk's own w
    if across is not None:
        u_next = heads @ across.T
    else:
        before, _ = _carry_scan(chunk_keep.flip(0).unsqueeze(0), heads.flip(1), 0.0)
        u_next = before.flip(1)
    dz = sums.add_((chunk_keep * u_next).unsqueeze(2)).mul_(unscale).to(w.dtype)
    return dz.view(B, n * L) if n * L == T else dz.view(B, n * L)[:, :T].contiguous()


def _positional_back_factors(q, v, p0, T, device):
    """(weight [n, L]: before_k; unscale [n, L]: gain_i / before_i; chunk_keep [n]: before_{L-1} keep_next;
    across [n, n] or None: u_next = heads @ across.T) for T tokens in n chunks of L, all float64 (see
    ``_positional_reverse_scan``)."""
    weight, unscale, chunk_keep, across = _positional_back_table(q, v, p0, _table_size(T), device)
    n = -(-T // weight.shape[1])
    return weight[:n], unscale[:n], chunk_keep[:n], None if across is None else across[:n, :n]


@functools.lru_cache(maxsize=8)
def _positional_back_table(q, v, p0, tokens, device):
    """``_positional_back_factors`` for a power of two of tokens."""
    gain, keep = gain_tensors(tokens + 1, q, v, p0, device, _F64)
    L = _chunk_length(keep[:tokens], CHUNK)  # the suffix sums' product costs L per token
    k = keep[:tokens].view(-1, L)
    before = torch.ones_like(k)
    before[:, 1:] = k[:, 1:].cumprod(dim=1)
    chunk_keep = before[:, L - 1] * keep[L : tokens + 1 : L]
    # across[j, i] (i > j): the keeps from chunk j + 1's first token to chunk i's, u_next's weight of heads_i
    across = (
        _carry_weights(chunk_keep)[0][:, :-1] if chunk_keep.numel() <= MAX_CHUNKS_IN_ONE_PRODUCT else None
    )
    return before, gain[:tokens].view(-1, L) / before, chunk_keep, across


@functools.lru_cache(maxsize=8)
def _suffix_sum_matrix(L, device):
    """[L, L] float64 lower-triangular ones: row-vector @ it = its suffix sums."""
    return torch.ones(L, L, dtype=_F64, device=device).tril_()
