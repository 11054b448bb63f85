"""What a user asks of the engine (`Request`) and what they get back (`Completion`)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from linnet.serve.structured import Structure

_ids = itertools.count()


MAX_LOGPROBS = 20  # the most top alternatives a token's logprobs may list (OpenAI's bound)


class RequestError(ValueError):
    """A request the engine cannot run as given; the message says why. Other requests go on.
    `field`: the `Request` field at fault, where one is (a server names its own parameter by it)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class EngineSettingError(ValueError):
    """An engine setting this model cannot run with (a token budget too small for its rows), or
    that is no setting at all (a budget that is not a whole number of tokens)."""


# The largest temperature or repetition penalty: the step holds it in f32, and XLA divides by one as
# a product with its reciprocal, which must not be a subnormal (flushed to 0, a banned -inf times it
# is NaN). Far past any use: 1e4 already draws near uniformly.
LARGEST_SCALE = 1e30

# What a request's sampling fields take: (least, most, whole number only), most None for no bound. vLLM's
# ranges, wider than OpenAI's (a temperature past 2, a repetition penalty past 10), up to what the step
# holds; a repetition penalty any above 0, down to 1 / LARGEST_SCALE (below, 0 in f32 makes a seen token's
# logit infinite), written 1e-30 so that messages say so. top_k's -1 is vLLM's "no limit", as 0 is. The
# engine (`Request.validate`), the server, the CLI and a model's generation config all check against it.
SAMPLING_RANGES = {
    "temperature": (0, LARGEST_SCALE, False), "top_p": (0, 1, False), "top_k": (-1, None, True),
    "min_p": (0, 1, False), "presence_penalty": (-2, 2, False), "frequency_penalty": (-2, 2, False),
    "repetition_penalty": (1e-30, LARGEST_SCALE, False),
}


def tokens(n: int) -> str:
    """'1 token', '5 tokens': a count as messages say it."""
    return f"{n} token{'' if n == 1 else 's'}"


def is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_number(x) -> bool:
    """A real number that is not NaN or infinite (json reads NaN and Infinity)."""
    if isinstance(x, bool):
        return False
    # an int is finite (math.isfinite cannot take one past a float's range: temperature 10**400)
    return isinstance(x, (int, np.integer)) or isinstance(x, (float, np.floating)) and math.isfinite(x)


@dataclass
class Request:
    prompt: list  # token ids: a list, a tuple or a 1-D integer numpy array
    max_new_tokens: int = 16
    temperature: float = 0.0  # 0 (or below 1e-5, as vLLM has it): greedy
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0  # 0: the likeliest token alone (OpenAI and llama.cpp take it; vLLM refuses it)
    min_p: float = 0.0
    # the same seed draws the same noise, whatever else is in the batch: the same tokens from the same
    # logits. In bf16 the logits move by a rounding with the pass's rows or a cached prefix (as vLLM's),
    # and a near tie may then go either way; f32 is stable to that far smaller rounding.
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_token_ids: list = field(default_factory=list)
    stop: list = field(default_factory=list)  # stop strings (needs the model's tokenizer)
    ignore_eos: bool = False
    min_tokens: int = 0  # end tokens (under ignore_eos too) and stop token ids are kept from being drawn before this
    #                      many, and stop strings count from the token after them (vLLM's)
    logprobs: int | None = None  # None: none; k: the chosen token's logprob and the top k alternatives, raw
    #                              (the model's, before bias, penalties, temperature and masks, as vLLM's)
    prompt_logprobs: int | None = None  # None: none; k: each prompt token's logprob (past the first), rank, top k
    logit_bias: dict | None = None  # {token id: added to its logit}, as OpenAI's (-100 bans, 100 forces)
    structure: "Structure | None" = None  # what the output must be: a JSON schema, regex, choice or grammar
    structure_after: list | None = None  # token ids after which the structure holds (a reasoning model's end of
    #                                      thinking); None: from the first token
    allowed_token_ids: list | None = None  # the only tokens it may draw (vLLM's); None: any
    # token id sequences the output never completes (vLLM's bad_words): each sequence's last token is
    # banned wherever the output so far ends with the rest of it (a one-token sequence: always)
    bad_words: list | None = None
    include_stop: bool = False  # the text keeps the stop string or token it ends at (include_stop_str_in_output)
    skip_special_tokens: bool = True  # the text leaves special tokens out, as vLLM's does by default
    keeps_end_token: bool = False  # the text keeps the end token it ends at, stop strings cut as ever (harmony's
    #                                parser reads a call's closing marker); otherwise only include_stop keeps it
    # vLLM's cache_salt: a prompt's cached tokens are shared only among requests of the same salt (None
    # is one salt too), so that one tenant cannot tell from its time to first token what another asked
    cache_salt: str | None = None
    id: str = field(default_factory=lambda: f"req-{next(_ids)}")

    @property
    def penalized(self) -> bool:
        """Whether any penalty moves this request's logits (the host then counts its tokens)."""
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def biased(self) -> bool:
        """Whether a bias moves this request's logits: its logit_bias, or its enders banned before min_tokens."""
        return bool(self.logit_bias) or self.min_tokens > 0 or bool(self.bad_words)

    @property
    def bans_follow_output(self) -> bool:
        """Whether the tokens banned at a draw depend on the tokens drawn before it: a bad word of
        more than one token (its last banned only after the rest)."""
        return any(len(word) > 1 for word in self.bad_words or ())

    def banned_words(self, output: list) -> set:
        """The tokens that would complete one of `bad_words` after `output`."""
        return {word[-1] for word in self.bad_words or ()
                if len(word) <= len(output) + 1 and list(output[len(output) - len(word) + 1:]) == list(word[:-1])}

    @property
    def restricted(self) -> bool:
        """Whether a mask limits the tokens this request may draw: a structure's, or its allowed tokens."""
        return self.structure is not None or self.allowed_token_ids is not None

    @property
    def adjusted(self) -> bool:
        """Whether arrays made on the host move this request's logits: penalties, a bias, or a mask."""
        return self.penalized or self.biased or self.restricted

    def validate(self, vocab: int, max_seq: int) -> "Request":
        """A `RequestError` naming the first field that cannot run as given: of the wrong type, NaN,
        or out of its range. Checked at submission, so that a bad request fails alone; nothing
        that passes may fail inside a step, where it would take the step's other requests with it.

        Returns a copy holding every field as plain Python values (token ids as lists of ints,
        numbers as ints and floats, flags as bools; a numpy array or integer is taken where a
        list or int is), which the engine runs: a numpy integer met Python's in its arithmetic
        (a uint64 max_new_tokens wrapped past the row's check, a negative int64 seed overflowed
        in the step)."""
        if not isinstance(self.id, str):  # (vLLM's request ids are strings; an unhashable one failed submit)
            raise RequestError(f"a request's id must be a string, not {self.id!r}", "id")
        plain = {"prompt": self._token_ids("prompt", vocab)}
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 0:
            raise RequestError(f"{self.id}: max_new_tokens must be an integer >= 0, not {self.max_new_tokens!r}",
                               "max_new_tokens")
        plain["max_new_tokens"] = int(self.max_new_tokens)
        need = len(plain["prompt"]) + plain["max_new_tokens"]
        if len(plain["prompt"]) > max_seq:  # (the prompt's fault: no max_new_tokens would fit it)
            raise RequestError(f"{self.id}: the prompt ({tokens(len(self.prompt))}) is longer than a cache row "
                               f"holds (MaxSeq = {max_seq})", "prompt")
        if need > max_seq:
            raise RequestError(f"{self.id}: the prompt ({tokens(len(self.prompt))}) plus max_new_tokens "
                               f"({self.max_new_tokens}) is {need} positions, more than a cache row holds "
                               f"(MaxSeq = {max_seq})", "max_new_tokens")
        # past LARGEST_SCALE a banned token's logit over the temperature is NaN, and the draw ignores every
        # mask; a repetition penalty under its reciprocal (0 in f32) makes a seen token's logit infinite
        for name, (lo, hi, whole) in SAMPLING_RANGES.items():
            if whole:  # (top_k, below: vLLM's -1 taken as the engine's "no limit", 0)
                continue
            value = getattr(self, name)
            if not _is_number(value) or not lo <= value <= hi:
                raise RequestError(f"{self.id}: {name} must be a number in [{lo:g}, {hi:g}], not {value!r}", name)
            plain[name] = float(value)
        if not is_int(self.top_k) or self.top_k < -1:
            raise RequestError(f"{self.id}: top_k must be an integer >= -1 (-1 or 0: no limit), not {self.top_k!r}",
                               "top_k")
        plain["top_k"] = max(0, int(self.top_k))  # (vLLM's -1, the engine's 0)
        if self.seed is not None and not is_int(self.seed):
            raise RequestError(f"{self.id}: seed must be an integer, not {self.seed!r}", "seed")
        plain["seed"] = None if self.seed is None else int(self.seed)
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(x, str) and x for x in self.stop):
            raise RequestError(f"{self.id}: stop must be a list of non-empty strings, not {self.stop!r}", "stop")
        plain["stop"] = [str(x) for x in self.stop]  # (a numpy string is a str)
        plain["stop_token_ids"] = self._token_ids("stop_token_ids", vocab, empty=True)
        if self.allowed_token_ids is not None:
            plain["allowed_token_ids"] = self._token_ids("allowed_token_ids", vocab)
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (not is_int(k) or not 0 <= k <= MAX_LOGPROBS):
                raise RequestError(f"{self.id}: {name} must be an integer between 0 and {MAX_LOGPROBS}, not {k!r}",
                                   name)
            plain[name] = None if k is None else int(k)
        if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= plain["max_new_tokens"]:
            raise RequestError(f"{self.id}: min_tokens must be between 0 and max_new_tokens ({self.max_new_tokens}), "
                               f"not {self.min_tokens!r}", "min_tokens")
        plain["min_tokens"] = int(self.min_tokens)
        if self.logit_bias is not None and not isinstance(self.logit_bias, dict):
            raise RequestError(f"{self.id}: logit_bias must be a dict of token id -> bias, not {self.logit_bias!r}",
                               "logit_bias")
        for t, v in (self.logit_bias or {}).items():
            if not is_int(t):  # (a JSON object's keys, strings, are the server's to read as ids)
                raise RequestError(f"{self.id}: logit_bias's keys are token ids, integers, not {t!r}", "logit_bias")
            if not 0 <= t < vocab:
                raise RequestError(f"{self.id}: logit_bias token id {t!r} is outside the vocabulary [0, {vocab})",
                                   "logit_bias")
            if not _is_number(v) or not -100 <= v <= 100:
                raise RequestError(f"{self.id}: logit_bias values must be numbers in [-100, 100], not {v!r}",
                                   "logit_bias")
        if self.logit_bias is not None:
            plain["logit_bias"] = {int(t): float(v) for t, v in self.logit_bias.items()}
        if self.structure_after is not None:
            plain["structure_after"] = self._token_ids("structure_after", vocab)
        for name in ("ignore_eos", "include_stop", "skip_special_tokens", "keeps_end_token"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):  # ('false' is true to Python)
                raise RequestError(f"{self.id}: {name} must be True or False, not {getattr(self, name)!r}", name)
            plain[name] = bool(getattr(self, name))
        if self.bad_words is not None:
            if not isinstance(self.bad_words, (list, tuple)):
                raise RequestError(f"{self.id}: bad_words must be a list of token id lists, not {self.bad_words!r}",
                                   "bad_words")
            plain["bad_words"] = [self._token_ids("bad_words", vocab, value=word) for word in self.bad_words]
        if self.cache_salt is not None:
            if not isinstance(self.cache_salt, str) or not self.cache_salt:
                raise RequestError(f"{self.id}: cache_salt must be a non-empty string (or None), not "
                                   f"{self.cache_salt!r}", "cache_salt")
            plain["cache_salt"] = str(self.cache_salt)  # (a numpy string: a plain one)
        from linnet.serve.structured import Structure

        if self.structure is not None and not isinstance(self.structure, Structure):
            raise RequestError(f"{self.id}: structure must be a linnet.serve.structured.Structure (a JSON schema, "
                               f"regex, choice or grammar), not {type(self.structure).__name__}", "structure")
        return dataclasses.replace(self, **plain)

    def _token_ids(self, name: str, vocab: int, empty: bool = False, value=None) -> list:
        """Field `name`'s token ids as Python ints: a list or tuple of integers, or a 1-D integer
        numpy array (a tokenizer's output); a RequestError naming the field otherwise (a bool or
        a float is no token id, nor one outside [0, vocab)). `empty`: whether it may hold none.
        `value`: the ids, where the field holds several lists of them (bad_words' words)."""
        value = getattr(self, name) if value is None else value
        what = "the prompt" if name == "prompt" else name
        if isinstance(value, np.ndarray) and value.ndim != 1:  # a tokenizer's batch of one: (1, n)
            raise RequestError(f"{self.id}: {what} must be a list of token ids (a 1-D array), not an array of shape "
                               f"{value.shape}", name)
        if not isinstance(value, (list, tuple, np.ndarray)):
            raise RequestError(f"{self.id}: {what} must be a list of token ids, not {type(value).__name__}", name)
        if isinstance(value, np.ndarray) and value.dtype.kind not in "iu":
            raise RequestError(f"{self.id}: {what} must hold integer token ids, not a {value.dtype} array", name)
        if not len(value) and not empty:
            raise RequestError(f"{self.id}: {what} is empty" + {
                "allowed_token_ids": ": no token could be drawn",
                "structure_after": " (None: the structure holds from the first token)"}.get(name, ""), name)
        # the prompt's messages as they were; another field's name it, and the server's "stop token id"
        label = {"prompt": "token id", "stop_token_ids": "stop token id"}.get(name, f"{name} token id")
        odd = [t for t in value if not is_int(t)]
        if odd:
            raise RequestError(f"{self.id}: {label} {odd[0]!r} is not an integer", name)
        bad = [t for t in value if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"{self.id}: {label} {int(bad[0])} is outside the vocabulary [0, {vocab})", name)
        return [int(t) for t in value]


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list  # [(token, logprob)], best first
    rank: int | None = None  # a prompt token's: 1 + how many tokens were likelier


@dataclass
class Completion:
    request: Request
    tokens: list = field(default_factory=list)
    finish_reason: str | None = None  # "length" | "stop" | "cancelled" | "error"
    stop_reason: int | str | None = None  # what stopped it (vLLM's): a stop_token_ids token or a stop string
    error: str | None = None
    # the Request field whose asking ended it in an error (its structure, its allowed_token_ids): the
    # client's doing, a 400 from the server; None where the engine failed (a 500)
    error_field: str | None = None
    logprobs: list = field(default_factory=list)  # [TokenLogprob] when asked for
    prompt_logprobs: list = field(default_factory=list)  # [None, TokenLogprob, ...]: one a prompt token, when asked for
    text: str | None = None  # decoded text, cut at a stop string, when the model has a tokenizer
    cached_tokens: int = 0  # prompt tokens not computed: reused in place or copied from another row
    submitted_at: float = 0.0
    first_token_at: float | None = None
    token_times: list = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.request.id
