"""The engines that sample completions for ``kpo eval``: transformers (CPU or GPU) and vLLM.

Reproducibility: every sample draws its randomness from its own generator seeded by
``(seed, dataset, problem id, sample index)`` (:func:`kpo.evaluation.cache.sample_seed`), so a completion does
not depend on which batch it ran in, on the batch size or on a resume. The transformers backend runs
``generate`` greedily over scores that a logits processor has turned into ``log_softmax(logits / T)``
(nucleus-filtered) plus per-row Gumbel noise: the arg-max of that is an exact sample from the
temperature/top-p distribution (the Gumbel-max trick). Where :mod:`kpo.generation` covers the model (the
embedded Qwen3 model, any ``Qwen3ForCausalLM``), its decoder runs the same argmax over the same processed scores
in place of ``generate`` (each row still draws its noise from its own generator, so a sample does not depend on
its batch either). vLLM takes the same per-sample seed through
``SamplingParams(seed=...)`` (its streams differ from transformers', so the backend is part of the cache key).

Each engine has ``name``, ``dtype``, ``tokenizer``, ``context_length`` (the model's positions, None if it does
not say) and ``generate(prompts, seeds, *, temperature, top_p, max_new_tokens)``.
"""

from __future__ import annotations

from pathlib import Path

from kpo._checks import no_tokenizer

BACKENDS = ("auto", "transformers", "vllm")
# Model dtypes both backends take by these names (vLLM has no float64).
DTYPES = ("bfloat16", "float16", "float32")
# The devices vLLM can honour: it places the model itself (on the GPUs CUDA_VISIBLE_DEVICES shows it).
_VLLM_DEVICES = ("auto", "cuda")


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def check_engine(backend: str, device: str, dtype: str | None) -> list[str]:
    """Problems with backend/device/dtype, found before anything loads, not as a failure deep inside it."""
    import importlib.util

    if backend not in BACKENDS:
        return [f"backend={backend!r} (--backend): must be one of {BACKENDS}"]
    errors = []
    if dtype is not None and dtype not in DTYPES:
        errors.append(
            f"dtype={dtype!r} (--dtype): must be one of {DTYPES}; leave it unset for the default "
            "(bfloat16 on GPU, float32 on CPU)"
        )
    if backend == "vllm":
        if importlib.util.find_spec("vllm") is None:
            errors.append(
                "backend='vllm' (--backend): vllm is not installed; pip install vllm, or use "
                "--backend transformers"
            )
        if device not in _VLLM_DEVICES:
            errors.append(
                f"device={device!r} (--device): vLLM places the model itself (choose its GPUs with "
                "CUDA_VISIBLE_DEVICES); drop --device or use --backend transformers"
            )
        return errors
    return errors + _check_device(device)


def _check_device(device: str) -> list[str]:
    """Problems with the transformers device: a malformed name, or a CUDA device this machine lacks."""
    import torch

    if device in ("auto", "cpu"):
        return []
    kind, colon, index = device.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        return [f"device={device!r} (--device): must be auto, cpu, cuda or cuda:N"]
    if not torch.cuda.is_available():
        return [
            f"device={device!r} (--device): no CUDA device is available (torch.cuda.is_available() is "
            "False); use --device cpu or --device auto"
        ]
    count = torch.cuda.device_count()
    if colon and int(index) >= count:
        return [
            f"device={device!r} (--device): this machine has {count} CUDA device(s), cuda:0 to "
            f"cuda:{count - 1}"
        ]
    return []


class _SeededSampler:
    """Logits processor: log_softmax(scores / T) restricted to the top-p nucleus, plus Gumbel noise drawn
    from one generator per row. Greedy decoding over its output samples from the nucleus distribution.

    scores: [B, V]; generators: B torch.Generators on the scores' device.
    """

    def __init__(self, generators: list, temperature: float, top_p: float):
        self.generators = generators
        self.temperature = temperature
        self.top_p = top_p

    def __call__(self, input_ids, scores):
        import torch

        logp = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_logp, order = logp.sort(dim=-1, descending=True)
            # Keep a token while the mass before it is below top_p (the top token is always kept).
            mass_before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()
            drop = torch.zeros_like(logp, dtype=torch.bool).scatter(-1, order, mass_before >= self.top_p)
            logp = logp.masked_fill(drop, float("-inf"))
        tiny = torch.finfo(torch.float32).tiny
        u = torch.stack(
            [torch.rand(logp.shape[-1], generator=g, device=logp.device) for g in self.generators]
        ).clamp_(min=tiny, max=1.0 - 1e-7)
        return logp - torch.log(-torch.log(u))


class TransformersBackend:
    """Batched ``generate`` with left padding on CPU or GPU."""

    name = "transformers"

    def __init__(self, model_path: str | Path, *, device: str = "auto", dtype: str | None = None):
        import torch
        from safetensors import SafetensorError
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = _resolve_device(device)
        torch_dtype = (
            getattr(torch, dtype)
            if dtype
            else (torch.bfloat16 if self.device.startswith("cuda") else torch.float32)
        )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_path)
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype)
        except (OSError, SafetensorError) as e:
            # The loaders' own failures (missing weights, unreadable config or weight files): name the model.
            raise ValueError(f"model={str(model_path)!r}: cannot load it: {e}") from e
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = model.to(self.device).eval()
        self.dtype = str(torch_dtype).removeprefix("torch.")
        self.context_length = getattr(model.config, "max_position_embeddings", None)
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        if not self.eos_ids or None in self.eos_ids:
            raise ValueError(
                f"{model_path}: neither the generation config nor the tokenizer names an eos token"
            )

    def generate(
        self, prompts: list[str], seeds: list[int], *, temperature: float, top_p: float, max_new_tokens: int
    ) -> list[tuple[str, int, bool]]:
        """(completion text, generated tokens incl. eos, stopped at eos) per prompt."""
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        from kpo.generation import generate, unsupported_model

        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            self.device
        )
        # Explicit neutral values: transformers fills unset fields from the model's generation_config (e.g. a
        # repetition penalty), which would silently change the sampling distribution.
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.tokenizer.pad_token_id,
        )
        processors = LogitsProcessorList()
        if temperature > 0:
            gens = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
            processors.append(_SeededSampler(gens, temperature, top_p))
        with torch.inference_mode():
            if unsupported_model(self.model) is None:
                # generate's greedy step over the processed scores (raw logits when greedy)
                out = generate(
                    self.model,
                    enc["input_ids"],
                    enc["attention_mask"],
                    max_new_tokens=max_new_tokens,
                    eos_token_ids=self.eos_ids,
                    pad_token_id=self.tokenizer.pad_token_id,
                    sample=lambda logits: processors(None, logits).argmax(-1),
                )
            else:
                out = self.model.generate(**enc, generation_config=config, logits_processor=processors)
                out = out[:, enc["input_ids"].shape[1] :]
        results = []
        for row in out.tolist():
            stop = next((i for i, t in enumerate(row) if t in self.eos_ids), None)
            tokens = row if stop is None else row[:stop]
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            results.append((text, len(tokens) + (stop is not None), stop is not None))
        return results


class VLLMBackend:
    """vLLM engine; one request per sample with its own seed."""

    name = "vllm"

    def __init__(self, model_path: str | Path, *, device: str = "auto", dtype: str | None = None):
        from vllm import LLM

        self.dtype = dtype or "auto"
        self.llm = LLM(model=str(model_path), dtype=self.dtype)
        self.tokenizer = self.llm.get_tokenizer()
        # vLLM's own limit (the model's positions, or --max-model-len); engines that hide it: None
        self.context_length = getattr(
            getattr(self.llm.llm_engine, "model_config", None), "max_model_len", None
        )

    def generate(
        self, prompts: list[str], seeds: list[int], *, temperature: float, top_p: float, max_new_tokens: int
    ) -> list[tuple[str, int, bool]]:
        from vllm import SamplingParams

        params = [
            SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=s)
            for s in seeds
        ]
        # token ids as the transformers backend makes them: vLLM tokenizes a string with special tokens, which
        # puts a second BOS before a chat-templated prompt (Llama, Gemma, Mistral)
        ids = [{"prompt_token_ids": self.tokenizer(p, add_special_tokens=False).input_ids} for p in prompts]
        outs = self.llm.generate(ids, params, use_tqdm=False)
        return [
            (o.outputs[0].text, len(o.outputs[0].token_ids), o.outputs[0].finish_reason == "stop")
            for o in outs
        ]


def _require_model_dir(model: str | Path) -> None:
    """Both backends load a local checkpoint; say so instead of a Hugging Face Hub lookup's traceback."""
    path = Path(model)
    if not path.is_dir():
        raise ValueError(
            f"model={str(model)!r}: no such directory; give a Hugging Face model directory "
            "(config.json, weights and tokenizer files)"
        )
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model={str(model)!r}: no config.json in this directory; give a Hugging Face model directory"
        )
    if (missing := no_tokenizer(path)) is not None:
        raise ValueError(f"model={str(model)!r}: {missing}")


def make_backend(name: str, model_path: str | Path, device: str, dtype: str | None):
    _require_model_dir(model_path)
    if name == "auto":
        import importlib.util

        import torch

        gpu = torch.cuda.is_available() and device in _VLLM_DEVICES
        name = "vllm" if gpu and importlib.util.find_spec("vllm") else "transformers"
    if name == "vllm":
        return VLLMBackend(model_path, device=device, dtype=dtype)
    return TransformersBackend(model_path, device=device, dtype=dtype)
