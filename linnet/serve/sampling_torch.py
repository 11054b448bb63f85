"""The sampler for the torch backend: the math of `sampling`, one batched pass on the logits' device."""

from __future__ import annotations

import numpy as np
import torch

from linnet.serve.sampling import MASK, NOISE, NOISE_BITS, SHIFT, SPLIT, SamplingBatch
from linnet.serve.torch_upload import upload


def _signed(c: int) -> int:
    """A uint32 constant as the int32 of the same bits."""
    return c - (1 << 32) if c >= 1 << 31 else c


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int32 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (32 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """`sampling.NOISE`'s mix, in place, on uint32 values held as int32: torch's uint32 has few ops
    on every device, and int64 arithmetic costs a CPU seven times more; products wrap, as uint32's."""
    x ^= _shr(x, 16)
    x *= _signed(NOISE["M1"])
    x ^= _shr(x, 15)
    x *= _signed(NOISE["M2"])
    x ^= _shr(x, 16)
    return x


def uniform(seed: torch.Tensor, step: torch.Tensor, vocab: int) -> torch.Tensor:
    """U(0, 1) noise f32[K, vocab] from (seed, step) int64[K]: `sampling.NOISE`'s hash."""
    low = lambda x: ((x & 0xFFFFFFFF) - ((x & 0x80000000) << 1)).to(torch.int32)  # the low 32 bits, as int32
    row = _mix(_mix(low(seed)) + low(step) * _signed(NOISE["STEP"]))
    token = torch.arange(vocab, device=seed.device, dtype=torch.int32)
    h = _mix(row[:, None] + token * _signed(NOISE["TOKEN"]))
    return unit(h)


def unit(h: torch.Tensor) -> torch.Tensor:
    """32-bit hashes (held as int32) as f32 in (0, 1): `sampling.NOISE_BITS` of them, and a half."""
    return (_shr(h, 32 - NOISE_BITS).float() + 0.5) * (1.0 / (1 << NOISE_BITS))


def kept_weights(scaled: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Each token's unnormalized probability under scaled logits [K, vocab], 0 where top-k, top-p
    or min-p leave it out (as sampling_jax.kept_weights): the k-th value from a top-k of the
    largest k asked, the nucleus from a sort that only a batch asking for top-p pays for."""
    device = scaled.device
    weights = torch.exp(scaled - scaled.amax(dim=-1, keepdim=True))
    limited = batch.top_k > 0
    if limited.any():
        k = np.minimum(np.where(limited, batch.top_k, 1), scaled.shape[-1]).astype(np.int64)
        values = torch.topk(scaled, int(k.max()), dim=-1).values
        kth = values.gather(1, upload(k - 1, device)[:, None])
        kth = torch.where(upload(limited, device)[:, None], kth, float("-inf"))
        weights = torch.where(scaled >= kth, weights, 0.0)
    probs = weights / weights.sum(dim=-1, keepdim=True)
    likeliest = probs.amax(dim=-1, keepdim=True)
    keep = probs >= upload(batch.min_p, device)[:, None] * likeliest
    if np.any(batch.top_p < 1):
        top_p = upload(batch.top_p, device)[:, None]
        ranked = _ranked_head(probs, top_p)
        inside = ((ranked.cumsum(dim=-1) - ranked) < top_p).sum(dim=-1, keepdim=True)  # mass before each < p
        nucleus = ranked.gather(1, (inside - 1).clamp(min=0))
        keep &= (probs >= nucleus) | (top_p >= 1)
    return torch.where(keep | (probs == likeliest), weights, 0.0)


def _ranked_head(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Each row's probabilities sorted, at least as far as its nucleus reaches. On a CPU, the top
    few hundred where they hold every row's nucleus (a tenth of a sort's cost; checking waits on
    nothing there); on an accelerator, or where they do not, the whole row."""
    if probs.device.type == "cpu":
        for head in (256, 4096):
            if head >= probs.shape[-1]:
                break
            ranked = torch.topk(probs, head, dim=-1).values
            if bool(((ranked.sum(dim=-1, keepdim=True) >= top_p) | (top_p >= 1)).all()):
                return ranked
    return probs.sort(dim=-1, descending=True).values


TIE_ROOM = 16  # tokens tied at the k-th alternative's logprob that _top_ids still orders by id


def sample(logits: torch.Tensor, batch: SamplingBatch, adjustments: tuple | None = None):
    """-> (tokens i32[K], chosen logprobs f32[K] or None, (top values, top ids) or None, ranks i32[K]
    or None): with logprobs, each drawn token's logprob and rank under the logits as the model gave
    them (vLLM's: 1 + how many tokens are strictly likelier), computed here, on the logits' device.
    `adjustments`: runners.logit_adjustments' arrays, as tensors, in the batch's form: the bias
    (SPLIT's own array), then the repetition penalty, then the shift (`sampling`'s order)."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1) if batch.logprobs >= 0 else None
    device = logits.device
    logits = adjusted(logits, batch, adjustments)
    if batch.greedy_only:
        tokens = logits.argmax(dim=-1)
    else:
        temp = upload(batch.temperature, device)
        weights = kept_weights(logits / temp.clamp(min=1e-5)[:, None], batch)
        noise = uniform(upload(batch.seed, device), upload(batch.step, device),
                        logits.shape[-1])
        tokens = torch.where(temp > 0, (weights / -torch.log(noise)).argmax(dim=-1), logits.argmax(dim=-1))
    tokens = tokens.to(torch.int32)
    if logprobs is None:
        return tokens, None, None, None
    chosen, top = _picked(logprobs, tokens, batch.logprobs)
    return tokens, chosen, top, _ranks(logprobs, chosen)


def adjusted(logits: torch.Tensor, batch: SamplingBatch, adjustments: tuple | None) -> torch.Tensor:
    """f32 logits [K, vocab] as the host's arrays move them, in `sampling`'s order: the bias
    (SPLIT's own array), then the repetition penalty, then the shift; or a mask's bans (MASK)."""
    if batch.adjustment == MASK and adjustments is not None:
        (allowed_bits,) = adjustments
        return banned_to_minus_inf(logits, allowed_bits)
    if batch.adjustment in (SHIFT, SPLIT) and adjustments is not None:
        if batch.adjustment == SPLIT:  # a row with a bias and a repetition penalty: the bias first
            seen_bits, bias, shift = adjustments
            logits = logits + bias
        else:
            seen_bits, shift = adjustments
        if np.any(batch.repetition != 1):
            logits = repetition_penalized(logits, upload(batch.repetition, logits.device)[:, None], seen_bits)
            logits += shift  # (a tensor of its own)
            return logits
        return logits + shift
    return logits


def probabilities(logits: torch.Tensor, batch: SamplingBatch, adjustments: tuple | None = None) -> torch.Tensor:
    """f32[K, vocab]: the distribution each row's token is drawn from, as `sample` draws it (its
    race picks token i with probability weight_i / sum): the adjusted logits over the temperature,
    what top-k, top-p and min-p keep, normalized; a greedy row's (temperature below 1e-5) all on its
    argmax. For checking the sampler against other implementations' definitions."""
    logits = adjusted(logits.float(), batch, adjustments)
    temp = upload(batch.temperature, logits.device)
    weights = kept_weights(logits / temp.clamp(min=1e-5)[:, None], batch)
    greedy = torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    return torch.where((temp > 0)[:, None], weights / weights.sum(dim=-1, keepdim=True), greedy)


def unpack_bits(words: torch.Tensor, n: int) -> torch.Tensor:
    """bool[K, n] from int32[K, ceil(n / 32)]: bit j of word w is element 32 w + j."""
    shifts = torch.arange(32, device=words.device, dtype=torch.int32)
    return ((words[:, :, None] >> shifts) & 1).bool().reshape(words.shape[0], -1)[:, :n]


_MINUS_INF_BITS = int(np.float32(-np.inf).view(np.int32))  # 0xFF800000, as an int32


def _bit_words(bits: torch.Tensor, n: int) -> torch.Tensor:
    """int32[K, n] from packed masks int32[K, ceil(n / 32)]: -1 (every bit set) where element j's
    bit is, else 0; words that select between two tensors' bits by and/xor, cheaper on a CPU than
    torch's where over a bool mask."""
    shifts = torch.arange(32, device=bits.device, dtype=torch.int32)
    words = bits[:, :, None] >> shifts
    words &= 1
    words.neg_()
    return words.reshape(bits.shape[0], -1)[:, :n]


def repetition_penalized(logits: torch.Tensor, rep: torch.Tensor, seen_bits: torch.Tensor) -> torch.Tensor:
    """f32 logits [K, n] with the repetition penalty rep f32[K, 1] (> 0) on the tokens whose bit
    packed masks int32[K, ceil(n / 32)] hold: z / rep where z > 0, z * rep otherwise, as
    where(seen, where(z > 0, z / rep, z * rep), z) gives them, bit for bit, as a new tensor. The
    choices are made on the values' bits: z / rep where z's sign bit is clear (+0 / rep is +0 * rep,
    a NaN stays a NaN either way), seen tokens' bits xored in through a word of all ones. torch's
    CPU where over bool masks, and the unpacked bools, cost several times as much (SmolLM2's 49k logits)."""
    z = logits.contiguous().view(torch.int32)
    chosen = (logits * rep).view(torch.int32)  # becomes the result, in place
    divided = (logits / rep).view(torch.int32)
    negative = z >> 31  # arithmetic: every bit set where the sign bit is
    chosen ^= divided
    chosen &= negative
    chosen ^= divided  # z / rep, or z * rep where z is negative
    chosen ^= z
    chosen &= _bit_words(seen_bits, logits.shape[-1])
    chosen ^= z  # the penalized value where seen, else z's own bits
    return chosen.view(torch.float32)


def banned_to_minus_inf(logits: torch.Tensor, allowed_bits: torch.Tensor) -> torch.Tensor:
    """f32 logits [K, n] with -inf where packed masks int32[K, ceil(n / 32)] hold no bit, as
    masked_fill(~unpack_bits(...), -inf) gives them, bit for bit (a NaN or +inf banned too), in
    int32 arithmetic on the logits' bits: each bit spread to a word of all ones or zeros keeps a
    logit's bits (xored with -inf's and back) or clears them to -inf's. torch's CPU where and
    masked_fill over a bool mask cost several times as much, and each temporary of a row's size a
    fresh allocation: two here, the rest in place (SmolLM2's 49k logits after a decode step: 0.26
    ms more than an unmasked draw so, 0.09 this way)."""
    keep = _bit_words(allowed_bits, logits.shape[-1])  # every bit set where the token is allowed
    bits = logits.contiguous().view(torch.int32) ^ _MINUS_INF_BITS
    bits &= keep
    bits ^= _MINUS_INF_BITS
    return bits.view(torch.float32)


def _picked(logprobs: torch.Tensor, tokens: torch.Tensor, k: int):
    """Each row's logprob of its token, and its k best (values, ids), or None for k = 0."""
    chosen = logprobs.gather(1, tokens.long()[:, None])[:, 0]
    if k == 0:
        return chosen, None
    ids = _top_ids(logprobs, k)
    return chosen, (logprobs.gather(1, ids), ids.to(torch.int32))


def _ranks(logprobs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Each row's rank of the logprob `chosen` holds for it: 1 + how many of the row's are larger.
    Counted in int32: torch's CPU sum of bools into its default int64 took 3.4x as long (16 x 49152,
    one thread: medians 6.5 ms against 1.9, log_softmax's 0.9 beside them)."""
    return torch.sum(logprobs > chosen[:, None], dim=-1, dtype=torch.int32) + 1


def _top_ids(values: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's k largest values' ids, ties lower id first, as XLA's top_k gives them (and argmax,
    greedy's token, picks): torch.topk leaves which tie it takes open. A topk of TIE_ROOM more, then
    those few ordered by (value down, id up): exact unless more than TIE_ROOM tokens past the k-th
    tie it (a stable sort of the whole row costs the step several times more)."""
    top = torch.topk(values, min(k + TIE_ROOM, values.shape[-1]), dim=-1)
    by_id = torch.argsort(top.indices, dim=-1)
    by_value = torch.argsort(top.values.gather(1, by_id), dim=-1, descending=True, stable=True)
    return top.indices.gather(1, by_id.gather(1, by_value))[:, :k]


def score(logits: torch.Tensor, targets: torch.Tensor, k: int):
    """Prompt tokens as the model saw them: row i's logprob of targets[i], with no penalty or bias,
    its rank among the vocabulary (1: the likeliest) and the row's k best.
    -> (logprobs f32[M], ranks i32[M], (top values, top ids) or None)"""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen, top = _picked(logprobs, targets, k)
    return chosen, _ranks(logprobs, chosen), top
