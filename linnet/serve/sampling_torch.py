"""The sampler for the torch backend: one batched pass on the logits' device."""

from __future__ import annotations

import torch

from linnet.serve.sampling import SamplingBatch

_M1 = -0x40A7B892E31B1A47  # 0xBF58476D1CE4E5B9 as a signed 64-bit number
_M2 = -0x6B2FB644ECCEEE15  # 0x94D049BB133111EB
_GOLDEN = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def uniform(seed: torch.Tensor, step: torch.Tensor, vocab: int) -> torch.Tensor:
    """U(0, 1) noise [K, vocab] from a counter-based hash of (seed, step, token): splitmix64."""
    idx = torch.arange(vocab, device=seed.device, dtype=torch.int64)
    x = seed[:, None] * _GOLDEN + step[:, None] * _M1 + idx[None, :] * _M2
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    x = x ^ _shr(x, 31)
    u = _shr(x, 11).to(torch.float64) * (1.0 / (1 << 53))
    return u.clamp_(1e-12, 1 - 1e-12).to(torch.float32)


def sample(logits: torch.Tensor, batch: SamplingBatch, adjustments: tuple | None = None):
    """-> (tokens i32[K], chosen logprobs f32[K] or None, (top values, top ids) or None).
    `adjustments`: (seen, counts, bias, allowed bits) tensors, runners.logit_adjustments' arrays."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1) if batch.logprobs >= 0 else None
    device = logits.device
    if batch.adjusted and adjustments is not None:
        seen, counts, bias, allowed_bits = adjustments  # None where no row needs it
        if seen is not None:
            rep = torch.as_tensor(batch.repetition, device=device)[:, None]
            penalized = torch.where(logits > 0, logits / rep, logits * rep)
            logits = torch.where(seen, penalized, logits)
            c = counts.float()
            logits = logits - torch.as_tensor(batch.frequency, device=device)[:, None] * c
            logits = logits - torch.as_tensor(batch.presence, device=device)[:, None] * (c > 0).float()
        if bias is not None:
            logits = logits + bias
        if allowed_bits is not None:
            logits = logits.masked_fill(~unpack_bits(allowed_bits, logits.shape[-1]), float("-inf"))
    if batch.greedy_only:
        tokens = logits.argmax(dim=-1)
    else:
        temp = torch.as_tensor(batch.temperature, device=device)
        greedy = logits.argmax(dim=-1)
        scaled = logits / temp.clamp(min=1e-5)[:, None]
        top_k = torch.as_tensor(batch.top_k, device=device).long()
        vocab = logits.shape[-1]
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        ranks = torch.arange(vocab, device=device)[None, :]
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))[:, None]
        keep = ranks < k
        probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the better tokens
        keep &= before < torch.as_tensor(batch.top_p, device=device)[:, None]
        keep &= probs >= torch.as_tensor(batch.min_p, device=device)[:, None] * probs[:, :1]
        keep[:, 0] = True
        masked_sorted = sorted_logits.masked_fill(~keep, float("-inf"))
        masked = torch.full_like(scaled, float("-inf")).scatter(1, order, masked_sorted)
        noise = uniform(torch.as_tensor(batch.seed, device=device), torch.as_tensor(batch.step, device=device), vocab)
        gumbel = -torch.log(-torch.log(noise))
        drawn = (masked + gumbel).argmax(dim=-1)
        tokens = torch.where(temp > 0, drawn, greedy)
    tokens = tokens.to(torch.int32)
    if logprobs is None:
        return tokens, None, None
    return (tokens, *_picked(logprobs, tokens, batch.logprobs))


def unpack_bits(words: torch.Tensor, n: int) -> torch.Tensor:
    """bool[K, n] from int32[K, ceil(n / 32)]: bit j of word w is element 32 w + j."""
    shifts = torch.arange(32, device=words.device, dtype=torch.int32)
    return ((words[:, :, None] >> shifts) & 1).bool().reshape(words.shape[0], -1)[:, :n]


def _picked(logprobs: torch.Tensor, tokens: torch.Tensor, k: int):
    """Each row's logprob of its token, and its k best (values, ids), or None for k = 0."""
    chosen = logprobs.gather(1, tokens.long()[:, None])[:, 0]
    top = torch.topk(logprobs, k, dim=-1) if k > 0 else None
    return chosen, (top.values, top.indices.to(torch.int32)) if top is not None else None


def score(logits: torch.Tensor, targets: torch.Tensor, k: int):
    """Prompt tokens as the model saw them: row i's logprob of targets[i], with no penalty or bias,
    its rank among the vocabulary (1: the likeliest) and the row's k best.
    -> (logprobs f32[M], ranks i64[M], (top values, top ids) or None)"""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen, top = _picked(logprobs, targets, k)
    return chosen, (logprobs > chosen[:, None]).sum(dim=-1) + 1, top
