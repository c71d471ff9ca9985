"""A transformers-backed rollout for verl 0.9.1 on the CPU (test-only): ``actor_rollout_ref.rollout.name=hf_cpu``.

verl registers only vLLM, SGLang and TensorRT-LLM rollouts, and none of them installs beside a CPU torch. This
module plugs a small one into verl's own rollout interfaces, the way vLLM's plugs in, so verl's trainer, agent
loop, reward loop and weight sync all run unchanged:

- :class:`HFCPURolloutServer`: the server a replica launches (a Ray actor). It holds the policy as a plain
  transformers model in ``actor_rollout_ref.rollout.dtype`` (verl's key; vLLM reads it too and defaults to
  bfloat16) and answers verl's token-in/token-out ``generate`` one request at a time with ``model.generate``
  (temperature, top-k, top-p as vLLM reads them; per-token log-probs after those, vLLM's "processed_logprobs",
  in float32 from the model's logits). ``load_weights`` replaces its weights with the actor's, cast to that
  dtype. A bfloat16 server beside verl's actor is a real train-inference mismatch: the same weights, rounded
  and computed differently (one token at a time from a key/value cache, not a padded batch).
- :class:`HFCPUReplica`: verl's ``RolloutReplica``: one server per replica (tensor parallel size 1: one per
  training worker), registered as "hf_cpu" in ``RolloutReplicaRegistry``.
- :class:`HFCPUServerAdapter`: verl's ``BaseRollout`` inside each hybrid actor worker. verl's "naive" weight
  sync hands it the FSDP actor's full tensors after every step; it ships them to its replica's server through
  Ray. Registered as ("hf_cpu", "async") in verl's rollout registry.

In verl's hybrid mode a GPU rollout frees its weights and KV cache while the actor trains (sleep/wake_up).
Here the server keeps its weights in host memory and keeps no cache between requests, so those calls have
nothing to do. Loaded like the platform (:mod:`tests.integrations.verl_cpu_platform`) through
``VERL_USE_EXTERNAL_MODULES``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import ray
import torch
from tests.integrations.verl_loss_capture import record_sample
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

__all__ = ["NAME", "HFCPUReplica", "HFCPURolloutServer", "HFCPUServerAdapter"]

NAME = "hf_cpu"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # actor_rollout_ref.rollout.dtype -> torch


def server_name(replica_rank: int) -> str:
    """Ray actor name of replica ``replica_rank``'s server (the adapter looks it up by this name)."""
    return f"{NAME}_server_{replica_rank}"


def _replica_world_size(config) -> int:
    return config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size


class HFCPURolloutServer:
    """One replica's generation server: a transformers model on the CPU.

    Args:
        config: verl's ``RolloutConfig`` (``response_length``, ``seed`` and ``dtype``, "float32" or "bfloat16",
            are read).
        model_config: verl's model config (DictConfig or ``HFModelConfig``); the checkpoint at its ``local_path``.
        replica_rank: this replica's rank (seeds its sampler with ``config.seed + replica_rank``).
    """

    def __init__(self, config, model_config, replica_rank: int):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.config = omega_conf_to_dataclass(config)
        self.model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        if self.config.dtype not in DTYPES:
            raise ValueError(
                f"hf_cpu rollout: actor_rollout_ref.rollout.dtype={self.config.dtype!r} is not supported; "
                f"use one of {', '.join(DTYPES)}"
            )
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path, dtype=DTYPES[self.config.dtype]
        )
        self.model.eval()
        torch.manual_seed(self.config.seed + replica_rank)
        self.global_steps = None
        self.weight_updates = 0

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, **_: Any
    ) -> TokenOutput:
        """Sample one response to ``prompt_ids``: up to ``response_length`` tokens, stopping at the end token.

        ``sampling_params`` is verl's dict: ``temperature`` (0 = greedy), ``top_k`` (-1 = off), ``top_p``,
        ``logprobs`` (return the log-probability of each sampled token). Other keyword arguments verl's client
        sends (``image_data``, ``video_data``, ...) are for multimodal servers; this one serves text.
        """
        temperature = float(sampling_params.get("temperature", 1.0))
        top_k = int(sampling_params.get("top_k", -1))
        if float(sampling_params.get("repetition_penalty", 1.0)) != 1.0:
            raise ValueError("hf_cpu rollout: repetition_penalty is not supported (verl's default is 1.0)")
        greedy = temperature == 0
        prompt = torch.tensor([list(prompt_ids)], dtype=torch.long)
        # verl's top_k -1 (off) is transformers' 0; left unset, transformers would sample from the top 50
        top_p = float(sampling_params.get("top_p", 1.0))
        sampling = {} if greedy else {"temperature": temperature, "top_k": max(top_k, 0), "top_p": top_p}
        # a block, not a decorator: torch.no_grad() would turn this coroutine into a plain function
        with torch.no_grad():
            out = self.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=self.config.response_length,
                do_sample=not greedy,
                return_dict_in_generate=True,
                output_scores=True,
                **sampling,
            )
        token_ids = out.sequences[0, prompt.shape[1] :].tolist()
        log_probs = None
        if sampling_params.get("logprobs"):
            # scores are the logits after temperature/top-k/top-p: log-probs of what was sampled from
            scores = torch.stack(out.scores, dim=1)[0].float().log_softmax(-1)
            log_probs = scores.gather(-1, torch.tensor(token_ids)[:, None])[:, 0].tolist()
        record_sample(token_ids, log_probs)
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    async def load_weights(self, tensors: dict[str, torch.Tensor], global_steps: int | None) -> int:
        """Replace every weight with the actor's (HF names, full tensors; copied into the server's dtype);
        returns how many updates so far."""
        self.model.load_state_dict(tensors, strict=True)
        self.global_steps = global_steps
        self.weight_updates += 1
        return self.weight_updates

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    # Hybrid-mode memory hand-over (module docstring): nothing to free or restore on the CPU.
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None


class HFCPUReplica(RolloutReplica):
    """verl's rollout replica for "hf_cpu": one :class:`HFCPURolloutServer` actor per replica."""

    async def launch_servers(self):
        if self.world_size != 1:
            raise ValueError(
                f"hf_cpu rollout serves one model per replica: set actor_rollout_ref.rollout."
                f"tensor_model_parallel_size=1 (and data/pipeline parallel 1), got a replica world size of "
                f"{self.world_size}"
            )
        server = (
            ray.remote(HFCPURolloutServer)
            .options(name=server_name(self.replica_rank), num_cpus=0)
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        # wait for the model to load, so a bad checkpoint fails here, not in the first generate
        await server.set_global_steps.remote(None)
        self.servers = [server]
        self._server_handle = server
        # verl keys its load balancer by address; generation goes through the actor handle, not HTTP
        self._server_address = f"{NAME}-replica-{self.replica_rank}"


class HFCPUServerAdapter(BaseRollout):
    """verl's rollout adapter inside a hybrid actor worker: forwards weight updates to its replica's server."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ["RANK"])
        world = _replica_world_size(self.config)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        # verl's checkpoint-engine worker asks for it; the first rank of a replica talks to its server
        self.is_leader_rank = rank % world == 0
        self._server = None

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        global_steps: int | None = None,
        **kwargs: Any,
    ):
        """Send the actor's full weights to the server. Every rank consumes ``weights``: producing each full
        tensor is a collective (FSDP2 all-gathers its shards)."""
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"hf_cpu rollout takes full tensors (named_tensors), got {wire_format!r}"
            )
        tensors = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        if not self.is_leader_rank:
            return
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        await self._server.load_weights.remote(tensors, global_steps)


def _register() -> None:
    key = (NAME, "async")
    rollout_base._ROLLOUT_REGISTRY.setdefault(key, f"{__name__}.HFCPUServerAdapter")
    RolloutReplicaRegistry.register(NAME, lambda: HFCPUReplica)


_register()
