"""A transformers model behind vLLM's async `generate` call shape, for running the agent executor
without vLLM: on a CPU, in tests, or to debug an env's rollouts before a cluster run.

`HFAsyncEngine.generate(prompt_token_ids, sampling_params)` returns an object shaped like vLLM's
`RequestOutput` (`.outputs[0].token_ids`, `.text`, `.finish_reason`, `.logprobs`). Concurrent
requests (the episodes of a group play at once) are gathered and sampled as one left-padded batch.
Sampling honours `temperature`, `top_p`, `top_k`, `max_tokens` and `logprobs` of the params object;
generation stops at the model's end-of-sequence ids, which are part of `token_ids` as in vLLM.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["HFAsyncEngine", "Completion", "RequestOutput", "Logprob"]


@dataclass
class Logprob:
    logprob: float


@dataclass
class Completion:
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[dict[int, Logprob]] | None = None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[Completion] = field(default_factory=list)


@dataclass
class _Request:
    prompt: list[int]
    params: Any
    future: asyncio.Future


class HFAsyncEngine:
    """Batched sampling from a transformers causal LM with vLLM's `generate` signature.

    Args:
        model: a causal LM (eval mode is set here).
        tokenizer: its tokenizer (for `text` and the pad id).
        seed: seeds the sampler, so a run is repeatable.
        batch_wait_s: how long the first request of a batch waits for others to join.
    """

    def __init__(self, model: Any, tokenizer: Any, seed: int = 0, batch_wait_s: float = 0.005) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.generator = torch.Generator(device="cpu").manual_seed(int(seed))
        self.batch_wait_s = float(batch_wait_s)
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.stop_ids = set([eos] if isinstance(eos, int) else list(eos or []))
        self._pending: list[_Request] = []
        self._flush: asyncio.Task | None = None
        self.calls = 0  # batched forward loops run (for tests and benchmarks)

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None, **_: Any) -> RequestOutput:
        loop = asyncio.get_running_loop()
        request = _Request([int(t) for t in prompt_token_ids], sampling_params, loop.create_future())
        self._pending.append(request)
        if self._flush is None or self._flush.done():
            self._flush = loop.create_task(self._run_batch())
        return await request.future

    async def _run_batch(self) -> None:
        await asyncio.sleep(self.batch_wait_s)
        batch, self._pending = self._pending, []
        try:
            outputs = await asyncio.to_thread(self._sample, batch)
        except Exception as e:  # hand the failure to every waiting episode
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(e)
            return
        for r, out in zip(batch, outputs, strict=True):
            if not r.future.done():
                r.future.set_result(out)

    @torch.no_grad()
    def _sample(self, batch: list[_Request]) -> list[RequestOutput]:
        self.calls += 1
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(r.prompt) for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):  # left padding: every row ends where generation starts
            ids[i, width - len(r.prompt) :] = torch.tensor(r.prompt)
            mask[i, width - len(r.prompt) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        limits = [max(1, int(getattr(r.params, "max_tokens", None) or 64)) for r in batch]
        generated: list[list[int]] = [[] for _ in batch]
        logprobs: list[list[dict[int, Logprob]]] = [[] for _ in batch]
        finished = [False] * len(batch)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        past = None
        step_ids, step_mask, step_pos = ids, mask, positions
        for t in range(max(limits)):
            out = self.model(input_ids=step_ids, attention_mask=step_mask, position_ids=step_pos, past_key_values=past,
                             use_cache=True, logits_to_keep=1)
            past = out.past_key_values
            logits = out.logits[:, -1, :].float()
            chosen = torch.empty(len(batch), dtype=torch.long)
            for i, r in enumerate(batch):
                if finished[i]:
                    chosen[i] = pad
                    continue
                token, lp = self._pick(logits[i], r.params)
                chosen[i] = token
                generated[i].append(token)
                logprobs[i].append({token: Logprob(lp)})
                if token in self.stop_ids or len(generated[i]) >= limits[i]:
                    finished[i] = True
            if all(finished):
                break
            step_ids = chosen.view(-1, 1).to(device)
            mask = torch.cat([mask, torch.ones((len(batch), 1), dtype=torch.long, device=device)], dim=1)
            step_mask = mask
            step_pos = (positions[:, -1:] + t + 1)
        results = []
        for i, r in enumerate(batch):
            tokens = generated[i]
            stopped = bool(tokens) and tokens[-1] in self.stop_ids
            skip = bool(getattr(r.params, "skip_special_tokens", False))
            text = self.tokenizer.decode(tokens[:-1] if stopped else tokens, skip_special_tokens=skip)
            want = getattr(r.params, "logprobs", None) is not None
            results.append(
                RequestOutput(r.prompt, [Completion(tokens, text, "stop" if stopped else "length", logprobs[i] if want
                                                    else None)])
            )
        return results

    def _pick(self, logits: torch.Tensor, params: Any) -> tuple[int, float]:
        """Sample one token (greedy at temperature 0) and its log-prob under the processed distribution."""
        temperature = float(getattr(params, "temperature", 1.0) if getattr(params, "temperature", None) is not None
                            else 1.0)
        if temperature <= 0:
            token = int(logits.argmax())
            return token, float(torch.log_softmax(logits, -1)[token])
        logits = logits / temperature
        top_k = int(getattr(params, "top_k", -1) or -1)
        if top_k > 0 and top_k < logits.numel():
            kth = torch.topk(logits, top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        top_p = float(getattr(params, "top_p", 1.0) or 1.0)
        if top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True)
            probs = torch.softmax(sorted_logits, -1)
            drop = probs.cumsum(-1) - probs > top_p
            logits = logits.clone()
            logits[order[drop]] = float("-inf")
        log_probs = torch.log_softmax(logits, -1)
        token = int(torch.multinomial(log_probs.exp(), 1, generator=self.generator))
        return token, float(log_probs[token])
