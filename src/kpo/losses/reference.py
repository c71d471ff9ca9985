"""Float64 loop references of every loss: value and gradient w.r.t. log_prob, written token by token from the
formulas of docs/methods.md (and the loss docstrings), independently of the vectorized code; the parity tests
compare every registered loss against it."""

from __future__ import annotations

import math

import torch

from kpo.filter.reference import kalman_filter_reference


def _clamp(x, lo, hi):
    return min(max(x, lo), hi)


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _max_branch(l1, d1, l2, d2):
    """Value and gradient of max(l1, l2); on a tie both branches carry the same gradient in our uses."""
    if l1 > l2:
        return l1, d1
    if l2 > l1:
        return l2, d2
    return l1, 0.5 * (d1 + d2)


def _rows(lp, olp, adv, mask):
    """Plain nested lists; advantages broadcast to [B][T]."""
    lp, olp, mask = lp.tolist(), olp.tolist(), mask.to(torch.bool).tolist()
    a = adv.reshape(len(lp), -1).tolist()
    A = [[row[0]] * len(lp[0]) if len(row) == 1 else row for row in a]
    return lp, olp, A, mask


def aggregate_reference(values, grads, mask, mode, scale_factor=None):
    """Loop aggregation of per-token values/grads (token-local losses) -> (loss, grad [B][T])."""
    B, T = len(mask), len(mask[0])
    n_tok = max(sum(sum(row) for row in mask), 1)
    lengths = [sum(row) for row in mask]
    n_seq = max(sum(1 for n in lengths if n > 0), 1)
    loss, grad = 0.0, [[0.0] * T for _ in range(B)]
    for b in range(B):
        for t in range(T):
            if not mask[b][t]:
                continue
            if mode == "token-mean":
                w = 1.0 / n_tok
            elif mode == "seq-mean-token-mean":
                w = 1.0 / (n_seq * lengths[b])
            elif mode == "seq-mean-token-sum":
                w = 1.0 / n_seq
            elif mode == "seq-mean-token-sum-norm":
                w = 1.0 / (n_seq * (T if scale_factor is None else scale_factor))
            elif mode == "token-sum":
                w = 1.0
            else:
                raise ValueError(mode)
            loss += w * values[b][t]
            grad[b][t] = w * grads[b][t]
    return loss, grad


def _token_local(fn, lp, olp, adv, mask, mode):
    lp, olp, A, m = _rows(lp, olp, adv, mask)
    vals = [[0.0] * len(lp[0]) for _ in lp]
    grads = [[0.0] * len(lp[0]) for _ in lp]
    for b in range(len(lp)):
        for t in range(len(lp[0])):
            if m[b][t]:
                vals[b][t], grads[b][t] = fn(b, t, lp[b][t], lp[b][t] - olp[b][t], A[b][t])
    return aggregate_reference(vals, grads, m, mode)


def vanilla(lp, olp, adv, mask, mode="token-mean", low=0.2, high=0.2, c=3.0, cap=None, keep=None):
    """``cap``: TRL's delta (the unclipped ratio capped at it); ``keep``: [B][T] bools of TRL's masks."""

    def fn(b, t, _lp, d, a):
        if keep is not None and not keep[b][t]:
            return 0.0, 0.0
        r = math.exp(_clamp(d, -20, 20))
        dr = r if abs(d) < 20 else 0.0
        if cap is not None and r > cap:
            l1, d1 = -a * cap, 0.0
        else:
            l1, d1 = -a * r, -a * dr
        l2, d2 = -a * _clamp(r, 1 - low, 1 + high), (-a * dr if 1 - low < r < 1 + high else 0.0)
        lc, dc = _max_branch(l1, d1, l2, d2)
        if a < 0 and lc > -a * c:
            return -a * c, 0.0
        return lc, dc

    return _token_local(fn, lp, olp, adv, mask, mode)


def off_policy_keep(lp, olp, adv, mask, threshold, rollout=None):
    """TRL's off-policy sequence mask, token by token: keep where A >= 0 or the row's mean of
    (reference - log_prob) over valid tokens is at most ``threshold`` (reference: rollout if given, else old)."""
    LP, OLP, A, m = _rows(lp, olp, adv, mask)
    ref_rows = OLP if rollout is None else rollout.tolist()
    keep = []
    for b in range(len(LP)):
        valid = [t for t in range(len(LP[b])) if m[b][t]]
        mean_kl = sum(ref_rows[b][t] - LP[b][t] for t in valid) / max(len(valid), 1)
        keep.append([A[b][t] >= 0 or mean_kl <= threshold for t in range(len(LP[b]))])
    return keep


def _quantile(values, q):
    """Linear-interpolation quantile of a list (torch.quantile's default)."""
    vals = sorted(values)
    pos = q * (len(vals) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (pos - lo) * (vals[hi] - vals[lo])


def high_entropy_keep(entropy, mask, top_quantile):
    """TRL's entropy mask: valid tokens whose entropy is at least the (1 - q) quantile over all valid tokens."""
    m = mask.to(torch.bool).tolist()
    ent = entropy.tolist()
    vals = [ent[b][t] for b in range(len(m)) for t in range(len(m[b])) if m[b][t]]
    threshold = _quantile(vals, 1.0 - top_quantile)
    return [[m[b][t] and ent[b][t] >= threshold for t in range(len(m[b]))] for b in range(len(m))]


def dppo(lp, olp, adv, mask, mode="token-mean", low=0.15, high=0.15, c=1e4, kind="tv"):
    """DPPO: -A min(r, c) log p on kept tokens (min(r, c) detached); the TV or Bernoulli-KL keep rule."""

    def fn(b, t, _lp, d, a):
        p, p_old = math.exp(_lp), math.exp(_lp - d)
        if kind == "tv":
            kept = p - p_old <= high if a > 0 else p - p_old >= -low
        else:
            kl = p_old * (-d) + (1 - p_old) * math.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
            kept = (kl <= high or p <= p_old) if a > 0 else (kl <= low or p >= p_old)
        if not kept:
            return 0.0, 0.0
        w = min(math.exp(_clamp(d, -20, 20)), c)
        return -a * w * _lp, -a * w

    return _token_local(fn, lp, olp, adv, mask, mode)


def gpg(lp, olp, adv, mask, mode="token-mean"):
    return _token_local(lambda b, t, _lp, d, a: (-a * _lp, -a), lp, olp, adv, mask, mode)


def dro(lp, olp, adv, mask, beta, mode="token-mean"):
    return _token_local(
        lambda b, t, _lp, d, a: (-(a * _lp - 0.5 * beta * d * d), -(a - beta * d)), lp, olp, adv, mask, mode
    )


def _cov_rows(lp, adv, m):
    """(A - mean A)(lp - mean lp) per valid token, the means over every valid token of the call."""
    cells = [(b, t) for b in range(len(m)) for t in range(len(m[b])) if m[b][t]]
    a_mean = sum(adv[b][t] for b, t in cells) / len(cells)
    lp_mean = sum(lp[b][t] for b, t in cells) / len(cells)
    return {(b, t): (adv[b][t] - a_mean) * (lp[b][t] - lp_mean) for b, t in cells}


def clip_cov(lp, olp, adv, mask, mode="token-mean", low=0.2, high=0.2, ratio=2e-4, lb=1.0, ub=5.0):
    """Clip-Cov when every candidate is zeroed (the number allowed is at least the number of candidates)."""
    LP, OLP, A, m = _rows(lp, olp, adv, mask)
    cov = _cov_rows(LP, A, m)

    def ppo(d, a):
        r = math.exp(d)
        l1, l2 = -a * r, -a * _clamp(r, 1 - low, 1 + high)
        return l1, l2, r

    candidates = set()
    for (b, t), c in cov.items():
        l1, l2, _ = ppo(LP[b][t] - OLP[b][t], A[b][t])
        if not l2 > l1 and lb < c < ub:
            candidates.add((b, t))
    if len(candidates) > max(int(ratio * len(cov)), 1):
        raise ValueError("the reference covers only the case where every candidate is picked")

    def fn(b, t, _lp, d, a):
        if (b, t) in candidates:
            return 0.0, 0.0
        l1, l2, r = ppo(d, a)
        return _max_branch(l1, -a * r, l2, -a * r if 1 - low < r < 1 + high else 0.0)

    return _token_local(fn, lp, olp, adv, mask, mode)


def kl_cov(lp, olp, adv, mask, mode="token-mean", ratio=2e-4, coef=0.1):
    """KL-Cov: -A r, plus coef |Delta| on the k = max(1, int(ratio N)) valid tokens of largest covariance."""
    LP, OLP, A, m = _rows(lp, olp, adv, mask)
    cov = _cov_rows(LP, A, m)
    k = max(1, int(len(cov) * ratio))
    top = set(sorted(cov, key=lambda cell: -cov[cell])[:k])

    def fn(b, t, _lp, d, a):
        r = math.exp(d)
        value, grad = -a * r, -a * r
        if (b, t) in top:
            value, grad = value + coef * abs(d), grad + coef * (1.0 if d > 0 else -1.0 if d < 0 else 0.0)
        return value, grad

    return _token_local(fn, lp, olp, adv, mask, mode)


def minpro(lp, olp, adv, mask, low=0.2, high=0.28):
    """MinPRO: -sg(clip(min_{i<t} r_i * r_t, 1 - low, 1 + high)) A log p; the minimum over earlier valid tokens."""
    _, _, _, m = _rows(lp, olp, adv, mask)
    prefix_min = {}
    d_all = (lp - olp).tolist()
    for b in range(len(m)):
        running = math.inf  # no earlier token yet
        for t in range(len(m[b])):
            if m[b][t]:
                prefix_min[b, t] = 1.0 if running == math.inf else running
                running = min(running, math.exp(_clamp(d_all[b][t], -20, 20)))

    def fn(b, t, _lp, d, a):
        w = _clamp(prefix_min[b, t] * math.exp(_clamp(d, -20, 20)), 1 - low, 1 + high)
        return -w * a * _lp, -w * a

    return _token_local(fn, lp, olp, adv, mask, "token-mean")


def sapo(lp, olp, adv, mask, tau_pos=1.0, tau_neg=1.05):
    def fn(b, t, _lp, d, a):
        r = math.exp(_clamp(d, -20, 20))
        tau = tau_pos if a > 0 else tau_neg
        s = _sigmoid(tau * (r - 1))
        return -a * s * 4 / tau, -a * 4 * s * (1 - s) * r

    return _token_local(fn, lp, olp, adv, mask, "seq-mean-token-mean")


def cispo(lp, olp, adv, mask, mode="token-mean", low=10.0, high=0.2):
    def fn(b, t, _lp, d, a):
        w = _clamp(math.exp(_clamp(d, -20, 20)), 1 - low, 1 + high)
        return -w * a * _lp, -w * a

    return _token_local(fn, lp, olp, adv, mask, mode)


def gspo(lp, olp, adv, mask, mode="seq-mean-token-mean", low=3e-4, high=4e-4):
    LP, OLP, _, m = _rows(lp, olp, adv, mask)
    s = []
    for b in range(len(LP)):
        n = sum(m[b])
        s.append(
            math.exp(min(sum(LP[b][t] - OLP[b][t] for t in range(len(LP[b])) if m[b][t]) / max(n, 1), 10))
        )

    def fn(b, t, _lp, d, a):
        l1, d1 = -a * s[b], -a * s[b]
        l2 = -a * _clamp(s[b], 1 - low, 1 + high)
        d2 = -a * s[b] if 1 - low < s[b] < 1 + high else 0.0
        return _max_branch(l1, d1, l2, d2)

    return _token_local(fn, lp, olp, adv, mask, mode)


def aspo(lp, olp, adv, mask, entropy=None, low=0.2, high=0.2, h_low=0.4, h_high=0.4, c=3.0, q=0.8):
    _, _, _, m = _rows(lp, olp, adv, mask)
    thresholds = []
    for b in range(len(m)):
        if entropy is None:
            thresholds.append(math.inf)
            continue
        vals = sorted(entropy[b][t].item() for t in range(len(m[b])) if m[b][t])
        if not vals:
            thresholds.append(math.nan)
            continue
        pos = q * (len(vals) - 1)
        lo_i, frac = int(math.floor(pos)), pos - math.floor(pos)
        hi_i = min(lo_i + 1, len(vals) - 1)
        thresholds.append(vals[lo_i] + frac * (vals[hi_i] - vals[lo_i]))

    def fn(b, t, _lp, d, a):
        low_entropy = entropy is None or entropy[b][t].item() <= thresholds[b]
        el, eh = (low, high) if low_entropy else (h_low, h_high)
        r = math.exp(_clamp(d, -20, 20))
        if a < 0:
            n = max(r, 1 - el)
            if n > c:
                return -a * c * _lp, -a * c
            return -a * n, (-a * r if r > 1 - el else 0.0)
        p = min(r, 1 + eh)
        if 1 / p > c:
            return -a * c * _lp, -a * c
        return -a / p, (-a / r if r < 1 + eh else 0.0)

    return _token_local(fn, lp, olp, adv, mask, "token-mean")


def ctpo(lp, olp, adv, mask, cl=0.025, ch=0.05, cc=0.05, power=0.5, ratio_mode="cumprod"):
    LP, OLP, _, m = _rows(lp, olp, adv, mask)
    prefix, position = {}, {}
    for b in range(len(LP)):
        acc, k = 0.0, 0
        for t in range(len(LP[b])):
            if m[b][t]:
                acc += _clamp(LP[b][t] - OLP[b][t], -20, 20)
                k += 1
                prefix[b, t], position[b, t] = (acc if ratio_mode == "cumprod" else acc / k), k

    def fn(b, t, _lp, d, a):
        pos = position[b, t]
        log_rho = min(prefix[b, t], 10.0)
        rho = math.exp(log_rho)
        drho = rho if prefix[b, t] < 10 else 0.0
        lo, hi = -cl * pos**power, ch * pos**power
        l1, d1 = -a * rho, -a * drho
        l2 = -a * math.exp(_clamp(log_rho, lo, hi))
        d2 = -a * drho if lo < log_rho < hi else 0.0
        lc, dc = _max_branch(l1, d1, l2, d2)
        l3 = -a * math.exp(cc * pos**power)
        if a < 0 and lc > l3:
            return l3, 0.0
        return lc, dc

    return _token_local(fn, lp, olp, adv, mask, "token-mean")


def vespo(lp, olp, adv, mask, k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0, log_tis=None):
    LP, OLP, A, m = _rows(lp, olp, adv, mask)
    phi = []
    for b in range(len(LP)):
        valid = [t for t in range(len(LP[b])) if m[b][t]]
        log_w = sum(_clamp(LP[b][t] - OLP[b][t], -20, 20) for t in valid)
        if log_tis is not None:
            log_w += sum(log_tis[b][t] for t in valid)
        log_w = _clamp(log_w, -20, 20)
        a_mean = sum(A[b][t] for t in valid) / max(len(valid), 1)
        k, lam = (k_pos, lambda_pos) if a_mean >= 0 else (k_neg, lambda_neg)
        phi.append(math.exp(lam + k * max(log_w, math.log(1e-8)) - lam * math.exp(log_w)))

    def fn(b, t, _lp, d, a):
        return -phi[b] * a * _lp, -phi[b] * a

    return _token_local(fn, lp, olp, adv, mask, "token-mean")


def kpo(lp, olp, adv, mask, mode="seq-mean-token-mean", low=3e-4, high=4e-4, clipped=True, **filt):
    z = (lp - olp).detach()
    rho = kalman_filter_reference(z, mask, **filt).tolist()

    def fn(b, t, _lp, d, a):
        rt = math.exp(min(rho[b][t], 10.0))
        drt = rt if rho[b][t] < 10 else 0.0
        if not clipped:
            return -a * rt, -a * drt
        l2 = -a * _clamp(rt, 1 - low, 1 + high)
        d2 = -a * drt if 1 - low < rt < 1 + high else 0.0
        return _max_branch(-a * rt, -a * drt, l2, d2)

    return _token_local(fn, lp, olp, adv, mask, mode)


def _seq_mean(seq_vals, seq_grads, m):
    n_seq = max(sum(1 for row in m if any(row)), 1)
    loss = sum(v for v, row in zip(seq_vals, m) if any(row)) / n_seq
    return loss, [[g / n_seq for g in row] for row in seq_grads]


def gmpo(lp, olp, adv, mask, low=0.4, high=0.4):
    LP, OLP, A, m = _rows(lp, olp, adv, mask)
    vals, grads = [], []
    for b in range(len(LP)):
        valid = [t for t in range(len(LP[b])) if m[b][t]]
        n = max(len(valid), 1)
        star, dstar = {}, {}
        for t in valid:
            d, a = LP[b][t] - OLP[b][t], A[b][t]
            if a > 0:
                star[t], dstar[t] = min(d, high), float(d < high)
            elif a < 0:
                star[t], dstar[t] = max(d, -low), float(d > -low)
            else:
                star[t], dstar[t] = 0.0, 0.0
        rho = math.exp(sum(star.values()) / n)
        a_bar = sum(A[b][t] for t in valid) / n
        vals.append(-a_bar * rho)
        grads.append([(-a_bar * rho * dstar[t] / n if t in dstar else 0.0) for t in range(len(LP[b]))])
    return _seq_mean(vals, grads, m)


def holder(lp, olp, adv, mask, p=1.0, low=0.2, high=0.2):
    LP, OLP, A, m = _rows(lp, olp, adv, mask)
    vals, grads = [], []
    for b in range(len(LP)):
        valid = [t for t in range(len(LP[b])) if m[b][t]]
        n = max(len(valid), 1)
        r = {t: math.exp(LP[b][t] - OLP[b][t]) for t in valid}
        if abs(p) < 1e-6:
            s = math.exp(sum(math.log(x) for x in r.values()) / n)
            ds = {t: s / n for t in valid}
        else:
            s = (sum(x**p for x in r.values()) / n) ** (1 / p) if valid else 1.0
            ds = {t: s ** (1 - p) * r[t] ** p / n for t in valid}
        a = sum(A[b][t] for t in valid) / n
        l1, l2 = -a * s, -a * _clamp(s, 1 - low, 1 + high)
        active = l1 > l2 or 1 - low < s < 1 + high
        vals.append(max(l1, l2))
        grads.append([(-a * ds[t] if t in ds and active else 0.0) for t in range(len(LP[b]))])
    return _seq_mean(vals, grads, m)


def cppo(lp, olp, adv, mask, delta=0.15, w_min=0.8, delta_b=0.015, quantile=None, mode="token-mean"):
    """CPPO's Algorithm 1 per row (Binary-TV D), then -A r on kept tokens (gradient -A r)."""
    LP, OLP, A, m = _rows(lp, olp, adv, mask)
    keep = {}
    for b in range(len(LP)):
        valid = [t for t in range(len(LP[b])) if m[b][t]]
        T = len(valid)
        D = {t: abs(math.exp(LP[b][t]) - math.exp(OLP[b][t])) for t in valid}
        budget = delta_b
        if quantile is not None and valid:
            budget = _clamp(_quantile(list(D.values()), quantile), delta_b, 2 * delta_b)
        S = W = 0.0
        for k, t in enumerate(valid, start=1):
            w = 1.0 - (1.0 - w_min) * (k - 1) / max(T - 1, 1)
            Z = w * D[t]
            r = math.exp(_clamp(LP[b][t] - OLP[b][t], -20, 20))
            keep[b, t] = A[b][t] * (r - 1.0) <= 0 or Z <= min(delta, delta + budget * W - S)
            S, W = S + Z, W + w

    def fn(b, t, _lp, d, a):
        r = math.exp(_clamp(d, -20, 20))
        return (-a * r, -a * r) if keep[b, t] else (0.0, 0.0)

    return _token_local(fn, lp, olp, adv, mask, mode)


def luspo(lp, olp, adv, mask, low=3e-4, high=4e-4, cap=None, keep=None):
    """LUSPO: per row |y| max(-A min(s, cap), -A clip(s)), s = exp(mean Delta); mean over non-empty rows.
    Gradient per token: that of the bound at s times s (d s / d lp_t = s / |y|, times |y|)."""
    LP, OLP, A, m = _rows(lp, olp, adv, mask)
    n_seq = max(sum(1 for row in m if any(row)), 1)
    loss, grad = 0.0, [[0.0] * len(LP[0]) for _ in LP]
    for b in range(len(LP)):
        valid = [t for t in range(len(LP[b])) if m[b][t]]
        if not valid:
            continue
        s = math.exp(min(sum(LP[b][t] - OLP[b][t] for t in valid) / len(valid), 10))
        for t in valid:
            if keep is not None and not keep[b][t]:
                continue
            a = A[b][t]
            l1, d1 = (-a * cap, 0.0) if cap is not None and s > cap else (-a * s, -a * s)
            l2, d2 = -a * _clamp(s, 1 - low, 1 + high), (-a * s if 1 - low < s < 1 + high else 0.0)
            value, g = _max_branch(l1, d1, l2, d2)
            loss += value / n_seq
            grad[b][t] = g / n_seq
    return loss, grad
