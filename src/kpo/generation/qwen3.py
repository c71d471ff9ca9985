"""A decoder specialised to the Qwen3 architecture (the embedded tiny model's): the HF model's weights packed into
fused projections (q/k/v in one matrix, gate/up in another) and a key/value cache preallocated (for the first
:data:`CACHE_STEPS` new tokens, then doubled when full), so a decode step is a handful of dense products on
``[B, hidden]`` rows and a write into the cache.

It computes what ``Qwen3ForCausalLM`` computes, in the model's dtype and the same order of operations per token
(RMSNorm in float32, q/k norms per head, rotary positions from the attention mask as ``generate`` derives them);
only the summation order inside the fused products differs, so logits agree to rounding
(tests/generation/test_generation.py checks them against the model's own forward).

With ``fp8=True`` it runs as an FP8 inference engine does (vLLM's ``quantization="fp8"`` with
``kv_cache_dtype="fp8"``): the input of every projection of the decoder blocks and every key and value are
rounded to float8 e4m3 with a scale per row (:func:`round_fp8`) before they are used; the weights are whatever the
model holds (``kpo.train.sampler`` rounds them to FP8 per output channel).

Prompts that repeat (GRPO's groups: each prompt ``num_generations`` times) are run through the prompt pass once
and their cache shared: the prompt part of the cache holds one copy per distinct prompt, and each decode step
attends to it and to its own response part, merging the two softmax pieces.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["CACHE_STEPS", "FP8_MAX", "PREFILL_TOKENS", "Qwen3Decoder", "round_fp8", "unsupported"]

# Tokens per chunk of the prompt pass (prompts are run in chunks of rows): a chunk's activations, ~2048 x 384
# floats at the embedded model's width, stay in cache; one pass over 128 distinct 129-token prompts at once took
# 0.50 s of CPU against 0.34 s in chunks of 16 prompts (1 thread).
PREFILL_TOKENS = 2048
# New tokens the response cache has room for before it first grows (then it doubles): a run allowed 1024 new
# tokens whose responses end after 100 does not hold 1024 tokens' keys and values for every row (28 GB for 128
# rows of a 28-layer model with 8 key/value heads of 128).
CACHE_STEPS = 256
FP8_MAX = 448.0  # the largest finite float8_e4m3fn value


def round_fp8(x: torch.Tensor) -> torch.Tensor:
    """``x`` [..., n] rounded to float8 e4m3 values with one scale per row of its last dimension (the row's max |x|
    over FP8_MAX: dynamic per-token scaling), returned in ``x``'s dtype."""
    scale = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return ((x.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(x.dtype)


def unsupported(model) -> str | None:
    """Why ``model`` cannot run on :class:`Qwen3Decoder` (None: it can)."""
    config = getattr(model, "config", None)
    if type(model).__name__ != "Qwen3ForCausalLM" or config is None:
        return f"{type(model).__name__} is not Qwen3ForCausalLM"
    device = model.get_input_embeddings().weight.device
    if device.type != "cpu":
        # measured and tested on CPU only; a GPU keeps generate (or vLLM) until the decoder is checked there
        return f"the model is on {device}, not the CPU"
    if getattr(config, "attention_dropout", 0.0):
        return f"attention_dropout={config.attention_dropout}"
    if getattr(config, "attention_bias", False):
        return "attention_bias=True"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act={config.hidden_act!r}"
    if getattr(config, "use_sliding_window", False) or any(
        t != "full_attention" for t in (getattr(config, "layer_types", None) or [])
    ):
        return "sliding-window attention"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return f"rope_type={rope.get('rope_type', rope.get('type'))!r}"
    return None


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm: statistics in float32, the weight applied in the input's dtype."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's ``x * cos + rotate_half(x) * sin`` (rotate_half: the halves of the last dim as (-x2, x1))."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Qwen3Decoder:
    """Prompt pass and decode steps of a ``Qwen3ForCausalLM`` (frozen for the decoder's life: build one per
    generation call, after the weights last changed).

    ``prefill(input_ids [B, Tp], attention_mask [B, Tp], max_new_tokens)`` -> next-token logits [B, V] (float32);
    then ``step(tokens [B])`` -> the logits after those tokens, at most ``max_new_tokens - 1`` times.
    ``fp8``: activations into the blocks' projections, keys and values rounded to FP8 (module docstring).
    """

    def __init__(self, model, *, fp8: bool = False):
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"Qwen3Decoder: {reason}")
        c = model.config
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        self.theta = _rope_theta(c)
        inner = model.model
        with torch.no_grad():
            self.embed = inner.embed_tokens.weight.detach()
            self.lm_head = model.lm_head.weight.detach()
            self.norm = inner.norm.weight.detach()
            self.layers = []
            for layer in inner.layers:
                a, m = layer.self_attn, layer.mlp
                self.layers.append(
                    {
                        "ln1": layer.input_layernorm.weight.detach(),
                        "qkv": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach(),
                        "q_norm": a.q_norm.weight.detach(),
                        "k_norm": a.k_norm.weight.detach(),
                        "o": a.o_proj.weight.detach(),
                        "ln2": layer.post_attention_layernorm.weight.detach(),
                        "gate_up": torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach(),
                        "down": m.down_proj.weight.detach(),
                    }
                )
        self.dtype, self.device = self.embed.dtype, self.embed.device
        self.scale = self.head_dim**-0.5
        self.fp8 = fp8

    # ------------------------------------------------------------------ pieces
    def _rope_table(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [positions, head_dim] as HF's default rotary embedding computes them (float32, then dtype)."""
        d = self.head_dim
        inv_freq = 1.0 / (
            self.theta
            ** (torch.arange(0, d, 2, dtype=torch.int64).to(device=self.device, dtype=torch.float) / d)
        )
        freqs = torch.arange(positions, device=self.device, dtype=torch.float)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def _qkv(self, w: dict, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [..., hidden] -> q [..., H, D], k and v [..., KV, D], q and k normed and rotated (cos/sin
        [..., 1, D])."""
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        qkv = self._linear(_rms(x, w["ln1"], self.eps), w["qkv"])
        q, k, v = qkv.split([h * d, kv * d, kv * d], dim=-1)
        q = _rotate(_rms(q.unflatten(-1, (h, d)), w["q_norm"], self.eps), cos, sin)
        k = _rotate(_rms(k.unflatten(-1, (kv, d)), w["k_norm"], self.eps), cos, sin)
        v = v.unflatten(-1, (kv, d))
        return (q, round_fp8(k), round_fp8(v)) if self.fp8 else (q, k, v)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """A projection of the decoder blocks (its input on the FP8 grid with ``fp8``)."""
        return F.linear(round_fp8(x) if self.fp8 else x, weight)

    def _mlp(self, w: dict, x: torch.Tensor) -> torch.Tensor:
        gate, up = self._linear(_rms(x, w["ln2"], self.eps), w["gate_up"]).chunk(2, dim=-1)
        return x + self._linear(F.silu(gate) * up, w["down"])

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(_rms(x, self.norm, self.eps), self.lm_head).float()

    # ------------------------------------------------------------------ prompt pass
    def _prompt_pass(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor):
        """Prompts ids/mask/positions [n, Tp] through the model: per layer keys [n*KV, D, Tp] and values
        [n*KV, Tp, D], and the last position's hidden state [n, hidden]."""
        n, tp = ids.shape
        kv, d = self.kv_heads, self.head_dim
        cos, sin = self.cos[positions][:, :, None], self.sin[positions][:, :, None]  # [n, Tp, 1, D]
        # causal attention among real tokens; a padding query sees itself only (its output is never read)
        eye = torch.eye(tp, dtype=torch.bool, device=self.device)
        allowed = (torch.ones(tp, tp, dtype=torch.bool, device=self.device).tril() & mask[:, None, :]) | eye
        bias = torch.zeros(n, 1, tp, tp, dtype=self.dtype, device=self.device)
        bias.masked_fill_(~allowed[:, None], float("-inf"))
        x = self.embed[ids]
        keys, values = [], []
        for w in self.layers:
            q, k, v = (t.transpose(1, 2) for t in self._qkv(w, x, cos, sin))  # [n, heads, Tp, D]
            keys.append(k.transpose(2, 3).reshape(n * kv, d, tp))
            values.append(v.reshape(n * kv, tp, d))
            attn = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, scale=self.scale, enable_gqa=kv != self.heads
            )
            x = x + self._linear(attn.transpose(1, 2).flatten(2), w["o"])
            x = self._mlp(w, x)
        return keys, values, x[:, -1]

    @torch.no_grad()
    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
    ) -> torch.Tensor:
        if input_ids.ndim != 2 or input_ids.shape != attention_mask.shape:
            raise ValueError(
                f"prefill: input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} "
                "must both be [batch, prompt_len]"
            )
        if max_new_tokens < 1:
            raise ValueError(f"prefill: max_new_tokens={max_new_tokens} must be >= 1")
        mask = attention_mask.to(torch.bool)
        if not bool(mask[:, -1].all()):
            raise ValueError("prefill: prompts must be left-padded (every row's last position a real token)")
        b, tp = input_ids.shape
        unique, row_prompt, counts = torch.unique(
            torch.cat([input_ids, mask.to(input_ids.dtype)], dim=1),
            dim=0,
            return_inverse=True,
            return_counts=True,
        )
        if bool((counts == counts[0]).all()):
            # rows sorted by their distinct prompt (a stable sort keeps a group's rows in their order)
            self.rep = int(counts[0])
            self.order = torch.argsort(row_prompt, stable=True)
            p_ids, p_mask = unique[:, :tp], unique[:, tp:].to(torch.bool)
        else:  # groups of unequal sizes: every row its own prompt
            self.rep = 1
            self.order = torch.arange(b, device=input_ids.device)
            p_ids, p_mask = input_ids, mask
        self.unorder = torch.argsort(self.order)
        n = p_ids.shape[0]
        # positions as generate derives them from the mask: real tokens 0, 1, ...; padding 0
        positions = (p_mask.long().cumsum(-1) - 1).clamp_(min=0)
        self.next_position = (positions[:, -1] + 1).repeat_interleave(self.rep)  # [B], sorted rows
        self.cos, self.sin = self._rope_table(int(self.next_position.max()) + max_new_tokens)
        kv, d = self.kv_heads, self.head_dim
        # the prompt pass in chunks of about PREFILL_TOKENS tokens: its activations stay in cache
        chunk = max(1, PREFILL_TOKENS // tp)
        pieces = [
            self._prompt_pass(p_ids[i : i + chunk], p_mask[i : i + chunk], positions[i : i + chunk])
            for i in range(0, n, chunk)
        ]
        # Keys are kept transposed ([D, T] per head) and values not ([T, D]): both decode products then read
        # their operand in rows, at memory speed (a transposed view of [T, D] keys runs at half of it).
        # per layer [n*KV, D, Tp] and [n*KV, Tp, D], rows ordered (prompt, kv head)
        self.prompt_kt = [torch.cat([kts[i] for kts, _, _ in pieces]) for i in range(len(self.layers))]
        self.prompt_v = [torch.cat([vs[i] for _, vs, _ in pieces]) for i in range(len(self.layers))]
        last = torch.cat([x for _, _, x in pieces])
        # each row's own keys/values, rows ordered (prompt, kv head, row of the group): [L, n*KV*rep, D, N] and
        # [L, n*KV*rep, N, D]
        # [L, n*KV*rep, N, D]; room for CACHE_STEPS tokens at first, doubled when full, up to max_new_tokens
        rows, room = n * kv * self.rep, min(max_new_tokens, CACHE_STEPS)
        self.max_new_tokens = max_new_tokens
        self.kt = torch.empty(len(self.layers), rows, d, room, dtype=self.dtype, device=self.device)
        self.v = torch.empty(len(self.layers), rows, room, d, dtype=self.dtype, device=self.device)
        # the prompt keys' mask per (prompt, kv head): 0 for real tokens, -inf for padding; [n*KV, 1, Tp]
        self.prompt_bias = torch.zeros(n, kv, 1, tp, dtype=self.dtype, device=self.device)
        self.prompt_bias.masked_fill_(~p_mask[:, None, None, :], float("-inf"))
        self.prompt_bias = self.prompt_bias.view(n * kv, 1, tp)
        self.t = 0
        logits = self._logits(last).repeat_interleave(self.rep, dim=0)  # sorted rows
        return logits[self.unorder]

    # ------------------------------------------------------------------ decode
    def _grow(self) -> None:
        """Double the response cache's room (at most max_new_tokens), keeping what it holds."""
        held = self.v.shape[2]
        room = min(2 * held, self.max_new_tokens)
        kt = self.kt.new_empty(*self.kt.shape[:-1], room)
        v = self.v.new_empty(self.v.shape[0], self.v.shape[1], room, self.v.shape[3])
        kt[..., :held] = self.kt
        v[:, :, :held] = self.v
        self.kt, self.v = kt, v

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        t = self.t
        if t >= self.max_new_tokens:
            raise ValueError(f"step: the cache holds {self.max_new_tokens} new tokens; none is left")
        if t == self.v.shape[2]:
            self._grow()
        h, kv, d, rep = self.heads, self.kv_heads, self.head_dim, self.rep
        g = h // kv
        b = tokens.shape[0]
        n = b // rep
        tp = self.prompt_bias.shape[-1]
        pos = self.next_position + t
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # [B, 1, D]
        x = self.embed[tokens[self.order]]
        for i, w in enumerate(self.layers):
            q, k, v = self._qkv(w, x, cos, sin)  # q [B, H, D]; k, v [B, KV, D]; B ordered (prompt, row)
            # to the cache's row order (prompt, kv head, row)
            self.kt[i].view(n, kv, rep, d, -1)[..., t] = k.view(n, rep, kv, d).transpose(1, 2)
            self.v[i].view(n, kv, rep, -1, d)[:, :, :, t] = v.view(n, rep, kv, d).transpose(1, 2)
            q = (q.view(n, rep, kv, g, d).transpose(1, 2) * self.scale).contiguous()  # [n, KV, rep, G, D]
            # scores against the prompt (shared by a prompt's rows) and against the row's own tokens
            s_prompt = torch.bmm(q.view(n * kv, rep * g, d), self.prompt_kt[i]) + self.prompt_bias
            s_own = torch.bmm(q.view(n * kv * rep, g, d), self.kt[i][:, :, : t + 1])  # [n*KV*rep, G, t+1]
            p = torch.cat([s_prompt.view(n * kv * rep, g, tp), s_own], dim=-1).softmax(-1)
            attn = torch.bmm(p[..., :tp].view(n * kv, rep * g, tp), self.prompt_v[i]).view(n * kv * rep, g, d)
            attn = attn + torch.bmm(p[..., tp:], self.v[i][:, : t + 1])
            x = x + self._linear(attn.view(n, kv, rep, g * d).transpose(1, 2).reshape(b, h * d), w["o"])
            x = self._mlp(w, x)
        self.t = t + 1
        return self._logits(x)[self.unorder]
