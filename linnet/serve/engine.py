"""The serving engine: continuous batching over the fixed cache rows of a compiled model.

Each request in flight owns one cache row. Every step is one pass of the
model: prompts waiting together are packed end to end into one prefill (no
padding), and the rows already decoding join that pass with one token each;
when no prompt waits, the step is the fixed-shape decode over every row.
Prompts sharing a prefix with a cached row are copied, not recomputed.

Where the runner's device works apart from the host (`looks_ahead`), a run of
decode steps is pipelined: step t + 1 is dispatched from step t's draws, still
on the device, before the host reads them; a request that ends at step t wastes
its row's share of step t + 1, whose draw is dropped.

The engine knows the model only through its entries (prefill, decode,
copy_rows) and its sizes (rows, positions, vocabulary).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import threading
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from linnet.kernels.openmp import release_pool
from linnet.serve.request import Completion, EngineSettingError, Request, RequestError, TokenLogprob, is_int, tokens
from linnet.serve.runners import make_runner, packed_mask
from linnet.serve.sampling import SamplingBatch
from linnet.serve.stats import Stats
from linnet.serve.structured import Guide, readable_error

log = logging.getLogger(__name__)  # a bug's traceback, for whoever runs the server (its clients get the message)


# id(model) -> the Engine whose background loop or run() steps that model (an entry lives while its
# engine does, and the engine keeps its model: the id names no other model meanwhile)
_LOOPERS: "weakref.WeakValueDictionary[int, Engine]" = weakref.WeakValueDictionary()
_LOOPERS_LOCK = threading.Lock()

SERVING_WINDOW = 1 << 16  # latency samples a serving (or hand-stepped) engine keeps for its percentiles
STOPPED = "the engine was stopped (Engine.stop) before this request ended"


@dataclass(eq=False)  # one request in flight is itself alone: list.remove and `in` by identity
class _Live:
    """A request in flight: its row, its tokens, how many of them are in the cache."""

    req: Request
    comp: Completion
    row: int
    seed: int
    prompt: list  # the request's prompt as Python ints (`req` is the plain copy `Request.validate` gives)
    tokens: list  # prompt + generated
    cached: int = 0  # positions of the row holding this request's tokens
    leader: "_Live | None" = None  # a request prefilling the same prompt, to copy from once it has
    share: int = 0  # how many prompt tokens to copy from the leader
    copy_from: tuple | None = None  # (row, tokens): a prefix to copy from another row before the next pass
    text: str = ""  # with stop strings: the generated text so far, decoded as the tokens come
    decoder: object = None
    matcher: object = None  # a structured output's llguidance matcher, following the tokens drawn
    structuring: bool = False  # whether the structure holds yet (from the start, or once structure_after was drawn)
    allowed: np.ndarray | None = None  # its allowed_token_ids as a packed mask (`runners.packed_mask`)
    # why its last draw could take no token (every logit -inf), or None: "mask" (a structure and
    # allowed_token_ids disjoint), "bans" (every token they allow, or any, banned: bad_words, min_tokens)
    cornered: str | None = None
    listeners: list = field(default_factory=list)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def generated(self) -> list:
        return self.tokens[self.prompt_len:]

    @property
    def masked(self) -> bool:
        """Whether a structure holds this request's next draw."""
        return self.matcher is not None and self.structuring

    def mask(self, structured: np.ndarray | None) -> np.ndarray | None:
        """The packed mask of the tokens its next draw may take: the structure's (when it holds) and
        its allowed tokens, both; None where any token may follow."""
        if self.allowed is None:
            return structured
        return self.allowed if structured is None else self.allowed & structured


@dataclass
class _Decode:
    """A dispatched decode step: the requests it draws for, in order, and its draws."""

    items: list
    pending: object  # runners.Pending


def common_prefix(a: list, b: list) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Engine:
    def __init__(self, model, token_budget: int | None = None, prefix_min: int = 64, seed: int = 0):
        """`token_budget`: most tokens in one pass (default: 2048 on a GPU, 512 on a CPU).
        `prefix_min`: shortest shared prefix worth copying from another row (equal prompts always are)."""
        if not all(hasattr(model, attr) for attr in ("runner", "module", "backend")):  # (vLLM's LLM takes a name)
            raise TypeError(f"Engine takes a model that linnet.nest.load gave, not {model!r}: "
                            f"Engine(nest.load(card, ...))")
        self.model = model
        self.runner = make_runner(model)
        self.rows = model.batch
        self.max_seq = model.max_seq
        self.vocab = model.vocab
        # Checked here, as a request's fields are at submission: a float budget cut a prompt's chunk
        # to a float, and a prefix_min of None failed admission, both inside a step
        for name, value in (("token_budget", token_budget), ("prefix_min", prefix_min), ("seed", seed)):
            if not (is_int(value) or value is None and name == "token_budget"):
                raise EngineSettingError(f"{name} must be an integer, not {value!r}")
        if prefix_min < 0:
            raise EngineSettingError(f"prefix_min must be >= 0 (a prefix's length in tokens), not {prefix_min}")
        on_gpu = str(getattr(model, "device", "cpu")).startswith("cuda")
        self.token_budget = token_budget if token_budget is not None else (2048 if on_gpu else 512)  # (0 is too small)
        # a pass must hold every row's decode token and still one piece of a prompt (JAX's in blocks of 8)
        runner = self.runner
        least = runner.overhead + max(2 * self.rows, self.rows * runner.chunk_cost(1) + runner.chunk_granule())
        if self.token_budget < least:
            raise EngineSettingError(f"token_budget ({self.token_budget}) is too small for {self.rows} rows: "
                                     f"at least {least}")
        self.prefix_min = prefix_min
        self.rng = random.Random(seed)
        self.tokenizer = getattr(model, "tokenizer", None)
        self.eos = set(self.tokenizer.eos_token_ids) if self.tokenizer is not None else \
            set(getattr(model, "end_tokens", ()))  # (a model loaded without its tokenizer: its checkpoint's)
        self.free_rows = list(range(self.rows))
        self.row_tokens: list = [[] for _ in range(self.rows)]  # tokens whose k/v each row holds, from 0
        self.row_salt: list = [None] * self.rows  # the cache_salt of the request that wrote each row's tokens
        self.waiting: list = []  # _Live without a row yet (row = -1)
        self.live: list = []
        # request id -> its _Live, from submission to its end: an id names one request in flight
        self.in_flight: dict = {}
        self.cancelled: dict = {}  # request id -> the request cancel() found in flight under it
        # Stepped by hand (submit, step), the engine runs as long as a server's loop does: its samples
        # are a window too. run() takes stats of its own, every sample of the run.
        self._fresh_stats(window=SERVING_WINDOW)
        self.lock = threading.Lock()
        self.wakeup = threading.Event()
        # start() and stop() one at a time: two event loops' first streams start one background loop, not two
        self._loop_lock = threading.Lock()
        self._thread = None
        self._run_thread = None  # the thread inside run(), while one is
        self._stopping = False
        self._ahead: _Decode | None = None  # a decode step dispatched and not yet read
        self._news: dict = {}  # event loop -> [(queue, (tokens so far, finish reason))] this step
        self._guide = None  # structured.Guide, made for the first structured request
        self._scoring_ahead = None  # the thread compiling prompt logprobs' passes ahead (`warm_scoring_later`)

    # ------------------------------------------------------------ submitting

    def submit(self, req: Request, listener=None) -> Completion:
        """Queues a request; raises `RequestError` at once if it can never run, or if a request
        with its id is in flight (submitted and not ended; that one goes on), as vLLM refuses one.

        `listener`, an (event loop, asyncio.Queue) pair, is told of every new token and of the end.
        """
        if not isinstance(req, Request):
            raise TypeError(f"submit takes a linnet.serve.Request, not {type(req).__name__}")
        if listener is not None and not (isinstance(listener, tuple) and len(listener) == 2
                                         and isinstance(listener[0], asyncio.AbstractEventLoop)
                                         and isinstance(listener[1], asyncio.Queue)):
            # (found only in the step, it failed every request there, or on its loop, the streams beside it)
            raise TypeError(f"a listener is an (event loop, asyncio.Queue) pair, not {listener!r}")
        asked, req = req, req.validate(self.vocab, self.max_seq)  # the engine runs its plain copy
        prompt = req.prompt
        # a draw no token is left to: every token allowed (or any) banned from the first by one-token bad words
        # and, under min_tokens, the end and stop tokens
        allowed = None if req.allowed_token_ids is None else packed_mask(req.allowed_token_ids, self.vocab)
        first = (req.banned_words([]) if req.bad_words else set()) | (self._enders(req) if req.min_tokens else set())
        if (allowed is not None or req.bad_words) and self._all_banned(allowed, first):
            if allowed is not None and req.min_tokens and set(req.allowed_token_ids) <= self._enders(req):
                raise RequestError(f"{req.id}: every token allowed_token_ids allows is an end or stop token, and "
                                   f"min_tokens ({req.min_tokens}) keeps those out until then: nothing could be drawn",
                                   "allowed_token_ids")
            allowing = "allowed_token_ids" if allowed is not None else "the vocabulary"
            raise RequestError(f"{req.id}: every token {allowing} allows is banned from the first draw by bad_words"
                               f"{' and min_tokens (its end tokens)' if req.min_tokens else ''}: nothing could be "
                               f"drawn", "bad_words")
        if req.stop and self.tokenizer is None:
            raise RequestError(f"{req.id}: stop strings need a tokenizer, and this model has none", "stop")
        matcher = None if req.structure is None else self.guide().matcher(req.structure, req.id)
        comp = Completion(asked, submitted_at=time.perf_counter())  # (the caller's request, as given)
        seed = req.seed if req.seed is not None else self.rng.getrandbits(31)
        item = _Live(req, comp, -1, seed, prompt, list(prompt), matcher=matcher, structuring=req.structure_after is None,
                     allowed=allowed,
                     listeners=[listener] if listener else [])
        if item.masked and item.allowed is not None and not item.mask(self._guide.allowed([matcher])[0]).any():
            raise RequestError(f"{req.id}: no token of allowed_token_ids can begin the structure asked for",
                               "allowed_token_ids")
        with self.lock:
            if req.id in self.in_flight:
                raise RequestError(f"{req.id}: a request with this id is already in flight (submitted, not yet "
                                   f"ended): give each request its own id (the same Request submitted twice shares "
                                   f"one; dataclasses.replace(req, id=...) makes a copy with another)", "id")
            self.in_flight[req.id] = item
            self.waiting.append(item)
            self.stats.prompt_tokens += len(prompt)
        self.wakeup.set()
        return comp

    def guide(self):
        """The structured outputs' guide over this model's tokenizer (made once: reading the vocabulary takes a while)."""
        if self._guide is None:
            if self.tokenizer is None:
                raise RequestError("structured outputs need a tokenizer, and this model has none", "structure")
            try:
                self._guide = Guide(self.tokenizer, self.vocab, sorted(self.eos))
            except ImportError:
                raise RequestError("structured outputs need llguidance: pip install llguidance", "structure") from None
        return self._guide

    def cancel(self, request_id: str) -> None:
        """Stops the request in flight with this id (finish_reason "cancelled"); its row is freed
        before the next pass. An id not in flight (unknown, or ended) is ignored, as vLLM's abort
        ignores one: a request submitted later under it is not cancelled."""
        with self.lock:
            x = self.in_flight.get(request_id)
            if x is not None:
                self.cancelled[request_id] = x
        self.wakeup.set()

    def has_work(self) -> bool:
        return bool(self.waiting or self.live)

    def _admissible(self) -> bool:
        """Whether a request queued may take a row now (one not `_held`): checked every step, so the
        queue is walked only while requests are being held."""
        if not self._holding():
            return bool(self.waiting)
        return any(x.req.prompt_logprobs is None for x in self.waiting)

    def _held(self, item: _Live) -> bool:
        """Whether the serving loop leaves `item` queued: a request scoring its prompt while the passes
        that do so compile ahead (`warm_scoring_later`). Admitted, its pass compiled on the engine's
        thread, and every request in flight waited (the soak's JAX server: 5 compiles in its first
        40 s); queued, it waits alone, for what its pass would have waited on anyway."""
        return item.req.prompt_logprobs is not None and self._holding()

    def _holding(self) -> bool:
        """Whether the background loop holds scored requests: the passes that score prompts are still
        compiling ahead (`_scoring_ahead` is set before that thread starts and cleared as it ends)."""
        return self._scoring_ahead is not None and threading.current_thread() is self._thread

    # ------------------------------------------------------------ running

    def warmup(self, prompt_lengths=(), logprobs: bool = False, structured: bool = False,
               adjusted: bool = False, prompt_logprobs: bool = False) -> None:
        """Compiles (JAX) or captures (CUDA) everything a run over such prompts needs: greedy and
        sampled draws; with `logprobs`, those that also give tokens' logprobs; with
        `prompt_logprobs`, the passes that score prompt tokens; with `structured`,
        those a token mask holds (structured outputs, forced tool calls, allowed_token_ids); with
        `adjusted`, those that penalties, a logit bias or min_tokens move: what a server's requests
        may ask for, each with the others. Under JAX, `prompt_lengths` bound the pass sizes compiled:
        every bucket up to their packed total (or the token budget, if less; with none given, up to
        the budget); a single length, only the passes that one prompt makes alone."""
        self._not_looping("warmup")
        if self.live:  # (queued requests hold nothing yet: they run after it as ever)
            raise RuntimeError(f"Engine.warmup() while {len(self.live)} request(s) hold cache rows: the warmup empties "
                               f"the cache, and they went on from rows that no longer held their tokens; step them "
                               f"to their end, or cancel them, first")
        if is_int(prompt_lengths):
            raise TypeError(f"warmup takes a list of prompt lengths, not one: warmup([{prompt_lengths}])")
        if isinstance(prompt_lengths, (str, bytes)):  # (iterated, its characters would be called the lengths)
            raise TypeError(f"warmup takes a list of prompt lengths, not a string: {prompt_lengths!r}")
        lengths = list(prompt_lengths)
        bad = [n for n in lengths if not is_int(n) or n < 1]
        if bad:
            raise ValueError(f"a prompt length must be a whole number of at least 1 (a prompt holds a token), "
                             f"not {bad[0]!r}")
        past = [n for n in lengths if n > self.max_seq]
        if past:  # (its passes were compiled, for a prompt every submission refuses)
            raise ValueError(f"a prompt length must be at most MaxSeq ({self.max_seq}, a cache row's positions), "
                             f"not {past[0]}: no request can have such a prompt")
        sizes = self._warmup_sizes(lengths)
        # Each form of the draw: a request that asks for a mask, or for a bias (of 0), or for a bias
        # and a repetition penalty (the bias then apart, before the penalty: `sampling.SPLIT`)
        forms = [{}] + ([{"allowed_token_ids": [0]}] if structured else []) + \
            ([{"logit_bias": {0: 0.0}}, {"logit_bias": {0: 0.0}, "repetition_penalty": 1.5}] if adjusted else [])
        modes = [self.sampling_mode(Request([0], temperature=t, logprobs=k, **asks))
                 for t in (0.0, 1.0) for k in ([None, 1] if logprobs else [None]) for asks in forms]
        compiled, named = self.runner.compiles, len(self.runner.compiled)
        with self.stepping():  # as the steps it warms run: outside it, torch's ops and the kernels fought for the cores
            self.runner.warmup(sizes, modes, scoring=prompt_logprobs)
        # (the next step forgets what the rows held; JAX's first reset compiles the program that zeroes the cache)
        self.model.reset()
        # what the warmup compiled is not the steps': an engine stepped by hand after it counts from 0
        self._compiles_before += self.runner.compiles - compiled
        self._named_before += len(self.runner.compiled) - named
        self._ahead = None

    def _warmup_sizes(self, lengths: list) -> list:
        """The pass sizes a warmup for prompts of these lengths makes (see `warmup`)."""
        if self.model.backend == "jax" and len(lengths) == 1:  # one prompt: the passes it makes alone
            return self._packs_of(lengths[0])
        if self.model.backend == "jax":
            packed = self.runner.overhead + sum(self.runner.chunk_cost(n) for n in lengths) if lengths else 0
            return self.runner.pass_sizes(min(self.token_budget, packed) if lengths else self.token_budget)
        return sorted({min(n, self.token_budget) for n in lengths})[:4] or [16]

    def warm_scoring_later(self, then=None) -> threading.Thread | None:
        """JAX: compiles what passes scoring prompt tokens (prompt_logprobs) run, at every pass size,
        on a thread of its own while the engine serves, running nothing (`JaxRunner.compile_scoring`):
        what `warmup(prompt_logprobs=True)` holds a start for, where few requests ask for it
        (SmolLM2's server on this CPU: about half of its warmup). A scored request that comes first
        waits queued under the background loop (`_held`); stepped otherwise, it compiles what its
        pass needs itself, as a run past its warmup does. The thread's compiles
        are not the steps' (`stats.compiles`). `then(seconds)`, where given, is called on the thread once
        it is done (the server says so: until then a scored request may stall the others). Returns the
        thread; None under torch (nothing to make)."""
        if self.model.backend != "jax":
            return None
        from linnet.serve.runners import uncounted

        sizes = self._warmup_sizes([])

        def compile_scoring():
            begun = time.perf_counter()
            try:
                with uncounted():
                    self.runner.compile_scoring(sizes)
                if then is not None:
                    then(time.perf_counter() - begun)
            finally:
                self._scoring_ahead = None  # the scored requests it held are let in (`_held`), woken here
                self.wakeup.set()
        thread = threading.Thread(target=compile_scoring, name="linnet-compile-scoring", daemon=True)
        self._scoring_ahead = thread
        thread.start()
        return thread

    def _packs_of(self, n: int) -> list:
        """The packs a prompt of n tokens makes alone, in the runner's tokens: each chunk after the
        runner's head of one-token slots (JAX's); and its last token alone, for the prompt asked
        again (its row kept)."""
        runner, room = self.runner, self.token_budget - self.runner.overhead
        packs, rest = [runner.overhead + runner.chunk_cost(1)], n
        while rest > 0:
            take = self._chunk(rest, room)
            packs.append(runner.overhead + runner.chunk_cost(take))
            rest -= take
        return packs

    def _chunk(self, rest: int, room: int) -> int:
        """How many of a prompt's `rest` tokens a pass with `room` tokens left takes: all, if they
        fit; else as many whole granules as fit (0: none)."""
        runner = self.runner
        if runner.chunk_cost(rest) <= room:
            return rest
        return min(rest, room // runner.chunk_granule() * runner.chunk_granule())

    def sampling_mode(self, req: Request) -> tuple:
        """Every row drawing as `req` does, what a warmup compiles the draws of a step for: (the
        sampling batch, the rows' histories or None), the arrays of `req`'s form (`sampling.MASK`,
        `sampling.SHIFT`, `sampling.SPLIT`) made to move little: every row held to token 0, or
        biased by 0, having seen token 0 alone (what a warmup draws is thrown away)."""
        batch = SamplingBatch.of([req] * self.rows, [0] * self.rows, [0] * self.rows)
        if not batch.adjusted:
            return batch, None
        mask = packed_mask([0], self.vocab) if req.restricted else None
        return batch, [([0], [], {0: 0.0}, mask)] * self.rows

    def run(self, requests: list) -> tuple[list, Stats]:
        """Runs every request to its end; returns their completions (in order) and the run's stats.

        A request that cannot run is returned with finish_reason "error" and its message; the rest run.
        Each entry runs on its own, as vLLM's `LLM.generate` runs a prompt listed n times n times: a
        request given again (the same object, as `[req] * n` gives it, or another with its id) runs
        as a copy under its id and "#2", "#3", ... (its completion's `request`). Requests submitted
        before and still in flight run with them: their own completions end, and the stats count them.
        """
        if isinstance(requests, Request):
            raise TypeError("run takes a list of linnet.serve.Request, not one: run([request])")
        requests = list(requests)
        odd = [r for r in requests if not isinstance(r, Request)]
        if odd:
            raise TypeError(f"run takes a list of linnet.serve.Request, not one holding a {type(odd[0]).__name__}")
        with self._loop_lock, _LOOPERS_LOCK:  # (a start() meanwhile, here or on another engine, sees this run)
            self._not_looping("run")
            self._run_thread = threading.current_thread()
            _LOOPERS[id(self.model)] = self
        try:
            return self._run(requests)
        finally:
            self._run_thread = None
            self._release_model()

    def _run(self, requests: list) -> tuple[list, Stats]:
        self._fresh_stats()
        # requests already in flight run with the run's, and its stats count their tokens and ends: their prompts too
        self.stats.prompt_tokens = sum(x.prompt_len for x in self.waiting + self.live)
        completions = []
        try:
            for req in requests:
                try:
                    completions.append(self.submit(self._own_id(req)))
                except RequestError as err:
                    # the client's doing, as a submission's RequestError says: its field, not None (an engine's failure)
                    completions.append(Completion(req, finish_reason="error", error=str(err), error_field=err.field))
                    self.stats.ended("error")
            start = time.perf_counter()
            with self.stepping():
                while self.has_work():
                    self.step()
                if self._ahead is not None:  # a step past the last request's end: wait it out, draws dropped
                    self._settle(self._ahead)
                    self._ahead = None
        except BaseException as err:
            # Ctrl-C, or a pass that failed: the run's requests end with it. Left in flight, the next
            # run() ran them to their end beside its own, in its time and its stats.
            self._end_all(f"the run was stopped: {err!r}")
            raise
        self.stats.seconds = time.perf_counter() - start  # the run's wall time, its steps' and what joins them
        self._count_compiles()
        return completions, self.stats

    def _own_id(self, req: Request) -> Request:
        """`req`, or where its id is in flight, a copy under the first of its id and "#2", "#3", ... that is not."""
        if not isinstance(req.id, str) or req.id not in self.in_flight:  # (no string: submit refuses it)
            return req
        k = 2
        while f"{req.id}#{k}" in self.in_flight:
            k += 1
        return dataclasses.replace(req, id=f"{req.id}#{k}")

    def _fresh_stats(self, window: int | None = None) -> None:
        self.stats = Stats(window=window)
        self._compiles_before = self.runner.compiles
        self._named_before = len(self.runner.compiled)
        self._compiles_logged = (0, 0)  # (compiles, named ones) of the stats' that `_log_compiles` has told

    def _count_compiles(self) -> None:
        """The stats' compiles since they began, less a warmup's: how many, and what each was."""
        self.stats.compiles = self.runner.compiles - self._compiles_before
        self.stats.compiled = self.runner.compiled[self._named_before:]

    def stepping(self):
        """Around steps a caller takes itself (`step`; `run` and `start`'s loop hold it): on a CPU whose
        passes run on Linnet's kernels, torch's own ops keep to this thread and the kernels take the
        cores (`kernels.pool`), rather than each waiting for the other's threads."""
        return self.runner.stepping()

    def step(self) -> None:
        """One pass: admit, copy shared prefixes, then a packed prefill or a decode. With a decode
        step out ahead and the same rows decoding, this step's work is that one's: the next goes
        out, then it is read. Listeners hear of the step's tokens once it is done. The stats count
        its time and what it compiled (an engine stepped by a server, not by `run`)."""
        if threading.current_thread() is not self._thread:
            self._not_looping("step")
        begun = time.perf_counter()
        try:
            self._step()
        finally:
            self.stats.seconds += time.perf_counter() - begun
            self._count_compiles()
            if threading.current_thread() is self._thread:
                self._log_compiles()
            self._tell_listeners()

    def _log_compiles(self) -> None:
        """A serving engine's compiles past its warmup, each logged as it happens: every request in
        flight waited on it (a pass size or a draw the warmup missed), which /metrics counts but an
        operator reading the server's log should see named, with when."""
        s = self.stats
        for what in s.compiled[self._compiles_logged[1]:]:
            log.warning("compiled while serving, every request in flight waiting on it: %s", what)
        if s.compiles > self._compiles_logged[0] and len(s.compiled) == self._compiles_logged[1]:
            log.warning("compiled while serving, every request in flight waiting on it: %d executable(s) of no "
                        "named pass", s.compiles - self._compiles_logged[0])
        self._compiles_logged = (s.compiles, len(s.compiled))

    def _step(self) -> None:
        holder = getattr(self.model, "holder", None)
        if holder is None or holder() is not self:
            # The cache changed under the engine: emptied (`model.reset()`), or written by another
            # engine over the same model since this one's last pass. What it remembers its rows
            # holding is gone.
            self.model.holder = weakref.ref(self)
            self.row_tokens = [[] for _ in range(self.rows)]
        with self.lock:
            self._drop_cancelled()
            self._admit()
        self._copy_shared()
        prefilling, decoding = self._prefilling(), self._decoding()
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            going = [x for x in ahead.items if x.comp.finish_reason is None]
            if not prefilling and len(decoding) == len(going) and all(x is y for x, y in zip(decoding, going)):
                self._send_next(ahead)  # steady decoding
                return
            self._settle(ahead)  # the rows changed: read it, then this step as usual
            prefilling, decoding = self._prefilling(), self._decoding()
        if prefilling:
            self._packed_pass(prefilling, decoding)
        elif decoding:
            self._decode_pass(decoding)

    def _prefilling(self) -> list:
        return [x for x in self.live if x.cached < x.prompt_len and x.leader is None]

    def _decoding(self) -> list:
        return [x for x in self.live if len(x.tokens) > x.prompt_len and x.cached == len(x.tokens) - 1]

    # ------------------------------------------------------------ admission and sharing

    def _admit(self):
        held = []  # (`_held`: queued again, in their order, ahead of those not yet looked at)
        while self.waiting and self.free_rows:
            item = self.waiting.pop(0)
            if self._held(item):
                held.append(item)
                continue
            scored = item.req.prompt_logprobs is not None
            if scored:
                # Scoring its prompt needs every prompt position's logits, so it reuses no cached prefix;
                # it takes the free row holding the least, sparing others' prefixes.
                row = min(self.free_rows, key=lambda r: len(self.row_tokens[r]))
                item.comp.prompt_logprobs = [None]  # the first token has nothing before it
            else:
                # Prefer a free row that still holds a prefix of this prompt worth reusing: it is reused in
                # place. Else the free row holding the least: a prefix too short to reuse (a chat's system
                # prompt alone) is no reason to cut another prompt's cached tokens short.
                row = max(self.free_rows, key=lambda r: (self._reusable(r, item), -len(self.row_tokens[r])))
                reuse = self._reusable(row, item)
                if reuse:
                    item.cached = item.comp.cached_tokens = reuse
                    self.stats.copied_tokens += reuse
            self.free_rows.remove(row)
            item.row = row
            self.row_tokens[row] = self.row_tokens[row][:item.cached]
            self.row_salt[row] = item.req.cache_salt
            if not scored:
                self._find_source(item)
            self.live.append(item)
        self.waiting[:0] = held

    def _held_prefix(self, row: int, item: _Live) -> int:
        """How many of `item`'s prompt tokens `row` holds that it may reuse: none from a row another
        cache_salt wrote. Every reuse of a row's tokens reads them through this."""
        return common_prefix(self.row_tokens[row], item.prompt) if self.row_salt[row] == item.req.cache_salt else 0

    def _reusable(self, row: int, item: _Live) -> int:
        """How many of `item`'s prompt tokens it would reuse from `row`: its held prefix (but the
        prompt's last token, whose logits the pass computes), where that is worth reusing, else 0."""
        n = min(self._held_prefix(row, item), len(item.prompt) - 1)
        return n if n >= self._worth(item.prompt) else 0

    def _worth(self, prompt: list) -> int:
        """The shortest prefix worth reusing: prefix_min, or the whole prompt but its last token."""
        return max(1, min(self.prefix_min, len(prompt) - 1))

    def _find_source(self, item: _Live):
        """Looks for a longer prefix in another row, or in a request still prefilling it."""
        prompt = item.prompt
        best_row, best = -1, item.cached
        for r in range(self.rows):
            if r == item.row:
                continue
            n = self._reusable(r, item)
            if n > best:
                best_row, best = r, n
        leader = None
        for other in self.live:
            if other.req.cache_salt != item.req.cache_salt:
                continue
            n = min(common_prefix(other.prompt, prompt), len(prompt) - 1)
            if other is not item and other.cached < n and n > best and n >= self._worth(prompt) and other.leader is None:
                leader, best = other, n
        if leader is not None:
            item.leader = leader
            item.share = best
        elif best_row >= 0:
            item.copy_from = (best_row, best)

    def _copy_shared(self):
        copies = []
        for item in self.live:
            if item.leader is not None:
                leader, n = item.leader, item.share
                if leader.comp.finish_reason is not None or leader.cached >= n:
                    item.leader = None
                    # (through `_held_prefix`: a leader that ended may have left its row to another salt's prompt)
                    n = min(n, self._held_prefix(leader.row, item))
                    if n >= self._worth(item.prompt) and n > item.cached:
                        copies.append((leader.row, item, n))
            elif item.copy_from is not None:
                (row, n), item.copy_from = item.copy_from, None
                n = min(n, self._held_prefix(row, item))
                if n > item.cached:
                    copies.append((row, item, n))
        if not copies:
            return
        src = np.array([r for r, _, _ in copies], np.int32)
        dst = np.array([x.row for _, x, _ in copies], np.int32)
        upto = np.array([n for _, _, n in copies], np.int32)
        self.runner.copy_rows(src, dst, upto)
        self.stats.passes["copy"] += 1
        for r, item, n in copies:
            self.row_tokens[item.row] = self.row_tokens[r][:n]
            self.stats.copied_tokens += n - item.cached
            item.comp.cached_tokens += n - item.cached
            item.cached = n

    # ------------------------------------------------------------ passes

    def _packed_pass(self, prefilling: list, decoding: list):
        tokens, positions, rows, last, sampled = [], [], [], [], []
        scored, prefilled = [], []  # (request, pack index, next prompt token); requests asking for no token
        for x in decoding:  # one token for each decoding row
            tokens.append(x.tokens[x.cached])
            positions.append(x.cached)
            rows.append(x.row)
            last.append(len(tokens) - 1)
            sampled.append(x)
        # The budget counts what the runner really computes: its fixed slots, padding of chunks.
        runner = self.runner
        budget = self.token_budget - runner.overhead - sum(runner.chunk_cost(1) for _ in decoding)
        chunks = []
        for x in prefilling:
            take = self._chunk(x.prompt_len - x.cached, budget)
            if take <= 0 or runner.chunk_cost(take) > budget:
                break
            if x.req.prompt_logprobs is not None:  # position j's logits score prompt token j + 1
                scored += [(x, len(tokens) + j - x.cached, x.tokens[j + 1])
                           for j in range(x.cached, min(x.cached + take, x.prompt_len - 1))]
            tokens.extend(x.tokens[x.cached:x.cached + take])
            positions.extend(range(x.cached, x.cached + take))
            rows.extend([x.row] * take)
            budget -= runner.chunk_cost(take)
            chunks.append((x, take))
            self.stats.prefill_tokens += take
            if x.cached + take == x.prompt_len:
                if x.req.max_new_tokens == 0:
                    prefilled.append(x)
                else:
                    last.append(len(tokens) - 1)
                    sampled.append(x)
        logits = self.runner.prefill(np.array(tokens, np.int32), np.array(positions, np.int32), np.array(rows, np.int32),
                                     np.array(last + [at for _, at, _ in scored], np.int32))
        self.stats.passes["mixed" if decoding else "prefill"] += 1
        self.stats.occupancy.append(len(self.live) / self.rows)
        for x in decoding:
            self._wrote(x, 1)
        for x, take in chunks:
            self._wrote(x, take)
        if scored:
            self._score(logits, len(last), scored)
        if sampled:
            self._sample(logits, sampled, list(range(len(sampled))))
        for x in prefilled:
            self._finish(x, "length")

    def _score(self, logits, start: int, scored: list):
        """Appends each scored prompt token's logprob, rank and top alternatives to its request's."""
        out = self.runner.score(logits, start, [t for _, _, t in scored], max(x.req.prompt_logprobs for x, _, _ in scored))
        for i, (x, _, token) in enumerate(scored):
            x.comp.prompt_logprobs.append(TokenLogprob(token, float(out.chosen[i]), _top(out, i, x.req.prompt_logprobs),
                                                       int(out.ranks[i])))

    def _decode_pass(self, decoding: list):
        tokens = np.zeros(self.rows, np.int32)
        for x in decoding:
            tokens[x.row] = x.tokens[x.cached]
        self._send_next(self._dispatch(decoding, tokens, ahead=0))

    def _send_next(self, step: _Decode):
        """Reads `step`, the step after it sent first where it can be: whole (`_look_ahead`), or its
        decode alone, its draw after `step` is read (`_decode_ahead`)."""
        if self._may_look_ahead():
            self._ahead = self._look_ahead(step)
        elif self._may_send_decode_ahead():
            self._ahead = self._decode_ahead(step)
            return
        self._settle(step)

    def _dispatch(self, items: list, tokens, ahead: int) -> _Decode:
        """Sends a decode step for `items`, `ahead` tokens past what the host has of each: their
        tokens are host ids or the previous step's `Pending`."""
        positions = np.full(self.rows, self.runner.padding, np.int32)  # idle rows: padding, which writes nothing
        for x in items:
            positions[x.row] = x.cached + ahead
        runner, rows = self.runner, [x.row for x in items]
        if runner.draws_apart and any(x.masked for x in items):
            # JAX: the decode goes out alone, its structures' masks are made on this thread while it
            # runs, then the draw over its logits (as `_decode_ahead`'s steps draw)
            pending = self._draw_after(runner.decode_alone(tokens, positions), items, ahead)
        else:
            batch, histories = self._sampling(items, ahead, later=runner.masks_during_the_step)
            try:
                pending = runner.decode_sample(tokens, positions, batch, rows, histories)
            except Exception:
                if callable(histories):  # the masks' thread lets go of the matchers before the engine goes on
                    with contextlib.suppress(Exception):
                        histories()
                raise
        self.stats.passes["decode"] += 1
        self.stats.occupancy.append(len(self.live) / self.rows)
        return _Decode(items, pending)

    def _may_look_ahead(self) -> bool:
        """Whether the next step can go out before this one is read: the runner's device works
        apart from the host, no prompt could be admitted to the next pass, and no request counts
        its output tokens into penalties, still bans its enders, bans the ends of bad words after their
        starts, or is held to a structure (the host keeps those counts, and a structure's next mask
        follows the token drawn)."""
        return (self.runner.looks_ahead and not (self.free_rows and self._admissible()) and not self.cancelled
                and not any(x.req.penalized or len(x.generated) < x.req.min_tokens or x.matcher is not None
                            or x.req.bans_follow_output for x in self.live))

    def _may_send_decode_ahead(self) -> bool:
        """Where the next step cannot go out whole before this one is read (its draws need the host's
        work on this one's tokens: a structure's mask, penalties' counts, min_tokens' bans), whether
        its decode can, alone (`runner.draws_apart`: JAX), as `_may_look_ahead` has it otherwise."""
        return (self.runner.draws_apart and self.runner.looks_ahead
                and not (self.free_rows and self._admissible()) and not self.cancelled)

    def _decode_ahead(self, step: _Decode) -> _Decode | None:
        """The decode after `step` sent from its draws on the device, for the requests it does not
        end by length; then `step` read and its tokens taken (matchers fed, counts kept) while that
        decode runs; then the draws of those it did not end, as a step of their own would draw them
        (the host's tokens, masks and counts as they are now). Returns that step, not yet read."""
        items = [x for x in step.items if x.comp.finish_reason is None and len(x.generated) + 1 < x.req.max_new_tokens]
        if not items:
            self._settle(step)
            return None
        positions = np.full(self.rows, self.runner.padding, np.int32)
        for x in items:
            positions[x.row] = x.cached + 1
        logits = self.runner.decode_alone(step.pending, positions)
        self.stats.passes["decode"] += 1
        self.stats.occupancy.append(len(self.live) / self.rows)
        self._settle(step)
        going = [x for x in items if x.comp.finish_reason is None]  # (a stop token, string or structure's end: its share wasted)
        if not going:
            return None
        return _Decode(going, self._draw_after(logits, going))

    def _draw_after(self, logits, items: list, ahead: int = 0):
        """The draws of `items` over a decode's logits sent alone (`runner.decode_alone`), their
        histories made now: while that decode runs."""
        batch, histories = self._sampling(items, ahead)
        return self.runner.draw_after(logits, batch, [x.row for x in items], histories)

    def _look_ahead(self, step: _Decode) -> _Decode | None:
        """The step after `step`, from its draws on the device, for the requests it does not end
        by length (a stop token it may draw only wastes that row's share)."""
        items = [x for x in step.items if x.comp.finish_reason is None and len(x.generated) + 1 < x.req.max_new_tokens]
        return self._dispatch(items, step.pending, ahead=1) if items else None

    def _settle(self, step: _Decode):
        """Reads a decode step's draws and takes them, but a request's that ended or was cancelled
        since the step went out."""
        out = step.pending.result()
        keep = [i for i, x in enumerate(step.items) if x.comp.finish_reason is None]
        for i in keep:
            self._wrote(step.items[i], 1)
        self._take(out, [step.items[i] for i in keep], keep)

    def _wrote(self, x: _Live, n: int):
        start = x.cached
        if len(self.row_tokens[x.row]) >= start:  # else forgotten under a request in flight: it holds no prefix
            self.row_tokens[x.row] = self.row_tokens[x.row][:start] + x.tokens[start:start + n]
        x.cached += n

    def _sampling(self, items: list, ahead: int = 0, later: bool = False):
        """How each of `items` draws its next token, `ahead` tokens past what the host has of it: the
        batch of settings, and where the host adjusts logits, each one's prompt and output tokens (which
        penalties count), logit bias and allowed tokens. `later`: where some are held to a structure,
        their histories as a function that gives them, their masks computed meanwhile, while the
        runner runs the model's step (`structured.Guide.allowed_later`)."""
        batch = SamplingBatch.of([x.req for x in items], [x.seed for x in items],
                                 [len(x.generated) + ahead for x in items])
        if not batch.adjusted:
            return batch, None
        structured = [x.matcher for x in items if x.masked]
        if structured and later:
            masks = self._guide.allowed_later(structured)
            return batch, lambda: self._histories(items, ahead, masks.result())
        return batch, self._histories(items, ahead, self._guide.allowed(structured) if structured else ())

    def _histories(self, items: list, ahead: int, masks) -> list:
        """Each of `items`' (prompt, output, logit bias, allowed tokens' packed mask or None), its
        structure's mask the next of `masks` where one holds it."""
        masks = iter(masks)
        histories = []
        for x in items:
            mask = x.mask(next(masks) if x.masked else None)
            banned = self._banned(x, ahead)
            x.cornered = "mask" if mask is not None and not mask.any() else "bans" if self._all_banned(mask, banned) \
                else None
            histories.append((x.prompt, x.generated, self._bias(x.req, banned), mask))
        return histories

    def _all_banned(self, mask: np.ndarray | None, banned: set) -> bool:
        """Whether `banned` holds every token `mask` allows (every token of the vocabulary, where None)."""
        if not banned:
            return False
        if mask is None:
            return len(banned) >= self.vocab and set(range(self.vocab)) <= banned
        # the banned tokens' bits cleared from the packed mask itself: a few words touched, where unpacking
        # it made a bool a token of the vocabulary, each draw of such a request
        ids = np.fromiter((t for t in banned if 0 <= t < self.vocab), np.int64)
        left = mask.astype(np.int32).view(np.uint32)  # (a copy)
        np.bitwise_and.at(left, ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))
        return not left.any()

    def _enders(self, req: Request) -> set:
        """The tokens min_tokens keeps from being drawn until then: `req`'s stop token ids and the end tokens,
        even under ignore_eos (as vLLM's min_tokens, which bans the end tokens whatever ignore_eos)."""
        return set(req.stop_token_ids) | self.eos

    def _banned(self, x: _Live, ahead: int) -> set:
        """The tokens x's next draw may not take: those that would complete a bad word (`ahead` > 0
        only where no ban follows the output: `_may_look_ahead`); and before min_tokens, those that
        would end it."""
        req = x.req
        banned = req.banned_words(x.generated) if req.bad_words else set()
        if len(x.generated) + ahead < req.min_tokens:
            banned |= self._enders(req)
        return banned

    @staticmethod
    def _bias(req: Request, banned: set) -> dict | None:
        """A request's logit bias for a draw: its own, and -inf for the tokens `banned`."""
        if not banned:
            return req.logit_bias
        return {**(req.logit_bias or {}), **dict.fromkeys(banned, float("-inf"))}

    @staticmethod
    def _cornered_error(x: _Live) -> tuple:
        """(field, message) of a request whose draw could take no token."""
        after = tokens(len(x.generated))
        if x.cornered == "mask":
            return "allowed_token_ids", (f"no token of allowed_token_ids fits the structure after {after}: nothing "
                                         f"could be drawn")
        req = x.req
        allowing = " and ".join([*(["allowed_token_ids"] if req.allowed_token_ids is not None else []),
                                 *(["the structure"] if x.masked else [])]) or "the vocabulary"
        why = " and ".join([*(["bad_words"] if req.banned_words(x.generated) else []),
                            *(["min_tokens (its end tokens)"] if len(x.generated) < req.min_tokens else [])])
        return ("bad_words" if req.bad_words else "min_tokens",
                f"every token {allowing} allows after {after} is banned by {why}: nothing could be drawn")

    def _sample(self, logits, items: list, logit_rows: list):
        batch, histories = self._sampling(items)
        self._take(self.runner.sample(logits, batch, histories, logit_rows), items, range(len(items)))

    def _take(self, out, items: list, at):
        """Appends draw at[i] of `out` to items[i]; ends those it ends."""
        now = time.perf_counter()
        for i, x in zip(at, items):
            if x.cornered:  # what was drawn for it is no token it may take (every logit was -inf)
                x.comp.error_field, x.comp.error = self._cornered_error(x)
                self._finish(x, "error")
                continue
            token = int(out.tokens[i])
            comp = x.comp
            x.tokens.append(token)
            comp.tokens.append(token)
            if comp.first_token_at is None:
                comp.first_token_at = now
                self.stats.ttft.append(now - comp.submitted_at)
            elif comp.token_times:
                self.stats.token_latency.append(now - comp.token_times[-1])
            comp.token_times.append(now)
            self.stats.generated_tokens += 1
            if x.req.logprobs is not None:
                comp.logprobs.append(TokenLogprob(token, float(out.chosen[i]), _top(out, i, x.req.logprobs),
                                                  int(out.ranks[i])))
            reason = self._finished(x, token)
            if reason:
                self._finish(x, reason)
            else:
                self._notify(x)

    def _finished(self, x: _Live, token: int) -> str | None:
        req = x.req
        held = len(x.generated) < req.min_tokens  # its enders were banned from the draw
        if not held and (token in req.stop_token_ids or (not req.ignore_eos and token in self.eos)):
            if x.masked and token not in req.stop_token_ids and not x.matcher.is_accepting():
                # the matcher allows the end token where no text could go on (a grammar with a rule no
                # text matches): the output is not what was asked for, and no "stop"
                x.comp.error = (f"structured output: after {tokens(len(x.generated) - 1)} no text could follow "
                                f"that the {req.structure.kind} matches")
                x.comp.error_field = "structure"
                return "error"
            # As vLLM: the text ends before the stop token, special or not, unless include_stop_str_in_output
            # (or, for an end token, keeps_end_token: harmony's parser reads its markers)
            if self.tokenizer is not None and not req.include_stop and (token in req.stop_token_ids
                                                                        or not req.keeps_end_token):
                x.comp.text = self._text(x, x.generated[:-1])
            # the model's own end token: None, as vLLM's; another end token (a generation config's), its id, as
            # vLLM makes those stop token ids
            own = token == getattr(self.tokenizer, "eos_token_id", None) and token not in req.stop_token_ids
            x.comp.stop_reason = None if own else token
            return "stop"
        if x.masked:
            x.matcher.consume_token(token)
            if x.matcher.is_error():
                error = readable_error(req.structure.kind, x.matcher.get_error())
                x.comp.error, x.comp.error_field = f"structured output: {error}", "structure"
                return "error"
            if x.matcher.is_stopped():  # the output is complete: nothing but an end token may follow
                return "stop"
        elif x.matcher is not None:  # thinking, free, until structure_after is drawn
            x.structuring = x.generated[-len(req.structure_after):] == list(req.structure_after)
        if req.stop:
            # Only a stop string that ends in the new text was not there before: each is looked for from
            # its own length before the new text (as vLLM's), so that one held back by min_tokens stays
            # passed, whatever other, longer stop strings the request has. As vLLM's, one counts from the
            # token after the min_tokens-th: that token's text is the request's too, whole.
            if x.decoder is None:
                x.decoder = self.tokenizer.incremental_decoder(skip_special_tokens=req.skip_special_tokens,
                                                               context=x.prompt)
            seen = len(x.text)
            x.text += x.decoder.push(token)
            found = [(at, -len(s)) for at, s in ((x.text.find(s, max(0, seen - len(s) + 1)), s) for s in req.stop)
                     if at >= 0]
            if found and len(x.generated) > req.min_tokens:
                at, minus_length = min(found)  # the first to begin; of those, the longest
                x.comp.text = x.text[:at - minus_length if req.include_stop else at]
                x.comp.stop_reason = x.text[at:at - minus_length]
                return "stop"
        if len(x.generated) >= req.max_new_tokens:
            return "length"
        return None

    def _text(self, x: _Live, ids: list) -> str:
        """The text `ids` add after x's prompt, less a character they stop partway through (its
        U+FFFD): a reply ends there, at max_tokens or before a stop token, as vLLM's detokenizer,
        which never emits a part of a character, ends it."""
        text = self.tokenizer.decode_after(x.prompt, ids, skip_special_tokens=x.req.skip_special_tokens)
        return self.tokenizer.without_cut_character(text, ids)

    def _finish(self, x: _Live, reason: str):
        """Ends x at a draw (its error, if any, already on its completion): its text, its row freed."""
        self._write_text(x)
        self.live.remove(x)
        # The row keeps what x cached: a follower of x copies it on the next step, unless the row
        # is taken first, in which case the follower copies only what is still valid (_copy_shared).
        self.free_rows.append(x.row)
        self._end(x, reason, x.comp.error)

    def _write_text(self, x: _Live) -> None:
        """x's text, of the tokens it has, where no stop has written it already."""
        if x.comp.text is None and self.tokenizer is not None:
            x.comp.text = self._text(x, x.generated)

    def _drop_cancelled(self):
        cancelled, self.cancelled = self.cancelled, {}
        for x in cancelled.values():
            if x.comp.finish_reason is None:  # (it may have ended since cancel() found it)
                self._drop(x, "cancelled")

    def _drop(self, x: _Live, reason: str, error: str | None = None):
        """Ends x between passes, where it is: queued, or in its row (freed, what it cached still valid)."""
        self._write_text(x)
        if x in self.live:
            self.live.remove(x)
            self.free_rows.append(x.row)
            # Only what is in the cache stays valid for reuse.
            self.row_tokens[x.row] = self.row_tokens[x.row][:x.cached]
        else:
            self.waiting.remove(x)
        # A request waiting on x to prefill their shared prompt keeps it as its leader: it copies what x
        # cached on the next step, as from one that finished (_copy_shared), rather than start over.
        self._end(x, reason, error)

    def _end(self, x: _Live, reason: str, error: str | None) -> None:
        """Writes x's end, however it ended (a draw, a cancel, stop(), a failed pass): its reason
        and error, counted, its id free again, its listeners told. Its row and its place in the
        queues are the caller's to give up. (Freeing the id needs no lock: a submission checks and
        takes an id under it, and sees it in flight or gone.)"""
        x.comp.finish_reason, x.comp.error = reason, error
        self.stats.ended(reason)
        self.in_flight.pop(x.req.id, None)
        self._notify(x)

    # ------------------------------------------------------------ incremental API (the server's)

    def _notify(self, x: _Live):
        """Notes that x has new tokens or has ended, for its listeners (told at the step's end)."""
        for loop, queue in x.listeners:
            self._news.setdefault(loop, []).append((queue, (len(x.comp.tokens), x.comp.finish_reason)))

    def _tell_listeners(self):
        """One wake-up per event loop a step, however many of its requests moved: a step of a
        64-row batch would otherwise cross threads 64 times."""
        news, self._news = self._news, {}
        for loop, items in news.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:
                # Its loop has closed (an asyncio.run that returned with a stream still open): no one
                # is left to tell. Raised in the step, it failed every request in flight, and raised
                # again there, it ended the server's loop.
                if not loop.is_closed():
                    raise

    def _not_looping(self, what: str) -> None:
        """Refuses `what` while the background loop (`start`) or a run() on another thread steps the
        engine: two threads stepping one model's cache would mix their passes."""
        self._no_run_elsewhere(what)
        if self.running:
            raise RuntimeError(f"Engine.{what}() while the engine's background loop runs (start(), or the first "
                               f"stream() started it): submit or stream requests to it instead, or stop() it first")
        self._no_other_looper(what)

    def _no_run_elsewhere(self, what: str) -> None:
        if self._run_thread is not None and self._run_thread is not threading.current_thread():
            raise RuntimeError(f"Engine.{what}() while run() steps the engine on another thread: submit() or "
                               f"cancel() requests there instead, or wait for run() to return")

    def _no_other_looper(self, what: str) -> None:
        """Refuses `what` while another engine's background loop or run() steps this one's model: two
        engines stepping one cache mixed their passes, and each one's tokens came out wrong, silently."""
        other = _LOOPERS.get(id(self.model))
        if other is not None and other is not self and (other.running or other._run_thread is not None):
            how = "background loop" if other.running else "run()"
            raise RuntimeError(f"Engine.{what}() while another Engine's {how} steps this model: two engines stepping "
                               f"one model's cache mix their passes; submit or stream to that one, or let it end "
                               f"first")

    def _release_model(self) -> None:
        """This engine steps its model no more (its loop stopped, its run() returned): another may."""
        with _LOOPERS_LOCK:
            if _LOOPERS.get(id(self.model)) is self:
                del _LOOPERS[id(self.model)]

    @property
    def running(self) -> bool:
        """Whether the background loop steps the engine (`start`, or a `stream` that started it)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Runs steps on a background thread whenever there is work (for `stream`, which starts it
        itself). Started already, nothing; after stop(), a loop anew."""
        with self._loop_lock, _LOOPERS_LOCK:
            if self.running:
                return
            self._not_looping("start")
            _LOOPERS[id(self.model)] = self
            # The steps' OpenMP regions go to the new thread: this one's idle pool would slow them (kernels.openmp).
            release_pool()
            self._stopping = False
            self._fresh_stats(window=SERVING_WINDOW)
            self._thread = threading.Thread(target=self._loop, name="linnet-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Ends the background loop, and every request not yet ended: finish_reason "error" and
        `STOPPED` as its error, its stream told (a consumer would otherwise wait for a start()
        that may never come: a server shutting down). Rows keep what they cached, for reuse.
        Stopped already, it ends what was submitted since; a later stream() or start() serves anew."""
        with self._loop_lock:
            self._no_run_elsewhere("stop")  # (its requests are run()'s to end, and its rows its to step)
            self._stopping = True
            self.wakeup.set()
            if self._thread is not None:
                self._thread.join()
                self._thread = None
            self._release_model()
            with self.lock:  # (a request submitted meanwhile is ended too, or queued after)
                self.cancelled = {}
                for x in self.live + self.waiting:
                    self._drop(x, "error", STOPPED)
            self._tell_listeners()

    def _loop(self):
        try:
            with self.stepping():
                self._serve()
        except BaseException as err:
            # The loop died (not stopped): what it held ends, rather than wait on a loop no longer
            # there; `running` is False, and the next start() or stream() begins another.
            self._end_all(f"engine loop died: {err!r}")
            raise

    def _serve(self):
        while not self._stopping:
            # (nothing in a row and every request queued held: a step would do nothing, again and again)
            if not self.live and not self.cancelled and not self._admissible():
                self.wakeup.wait(0.05)
                self.wakeup.clear()
                continue
            try:
                self.step()
            except Exception as err:  # a failed pass fails the requests in it, not the server
                log.exception("a pass failed: the requests in flight end with its error")
                self._end_all(f"engine error: {err}")

    def _end_all(self, error: str) -> None:
        """Ends every request in flight or queued with `error`, and forgets what the rows hold: a
        pass stopped partway leaves the cache and the engine's account of it apart. Under the lock,
        so that a request submitted meanwhile is ended too, not dropped unheard."""
        with self.lock:
            # every request in flight: one a failed admission took from the queue and had not yet put in a row too
            ended = list(self.in_flight.values())
            self.live, self.waiting, self.cancelled = [], [], {}
            for x in ended:  # (no text decoded: the tokenizer may be what failed, and raised again here)
                self._end(x, "error", error)
        self._ahead = None
        self.free_rows = list(range(self.rows))
        self.row_tokens = [[] for _ in range(self.rows)]
        self._tell_listeners()

    def stream(self, req: Request, loop: asyncio.AbstractEventLoop | None = None) -> "TokenStream":
        """Submits `req` (from a coroutine); iterate the result for (new token ids, finish_reason or None).
        Starts the background loop if it is not running, as vLLM's AsyncLLMEngine starts its own on
        the first request: nothing else steps the engine for an asyncio caller, whose stream waited
        for ever without it. A request refused at submission starts nothing. `loop`: the event loop
        its tokens are told on and it is read on, where it is submitted from another thread (a
        structure's matcher is compiled at submission: seconds, for a large one, of a loop's time)."""
        if not self.running:  # (before the request is queued where no loop would take it)
            self._not_looping("stream")
        stream = TokenStream(self, req, loop)
        self.start()
        return stream


def _top(out, i: int, k: int) -> list:
    """Row i's k likeliest tokens, [(token, logprob)], from a pass's `Sampled`."""
    if not k or out.top_ids is None:
        return []
    return [(int(t), float(v)) for t, v in zip(out.top_ids[i][:k], out.top_values[i][:k])]


def _cancel_unended(engine: Engine, comp: Completion) -> None:
    if comp.finish_reason is None:
        engine.cancel(comp.id)


def _deliver(items: list):
    for queue, item in items:
        queue.put_nowait(item)


class TokenStream:
    """One request's tokens as they come; `completion` holds the whole result. Leaving early, or
    dropping it unread, cancels it."""

    def __init__(self, engine: Engine, req: Request, loop: asyncio.AbstractEventLoop | None = None):
        try:
            loop = loop or asyncio.get_running_loop()
        except RuntimeError:  # (asyncio's own message, "no running event loop", names neither)
            raise RuntimeError("Engine.stream() is called from a coroutine: its tokens come through the running "
                               "event loop; without one, submit() the request and step() the engine "
                               "(or start() it) until its completion ends") from None
        self.engine = engine
        self.loop = loop  # the one its tokens are told on
        self.queue: asyncio.Queue = asyncio.Queue()
        self.completion = engine.submit(req, listener=(loop, self.queue))
        self._iterated = False
        # Dropped without being iterated to its end, as one left early: its request goes (its row to others)
        weakref.finalize(self, _cancel_unended, engine, self.completion)

    def __aiter__(self):
        # One consumer: a second iteration waited for ever on the queue the first had emptied (or,
        # beside it, took half its tokens)
        if self._iterated:
            raise RuntimeError(f"{self.completion.id}: a stream is iterated once (its tokens go to one consumer); "
                               f"what it gave is in its completion")
        # Its tokens are told on the loop it was made on: read on another (that one closed, an
        # asyncio.run apart), it waited for ever
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError(f"{self.completion.id}: a stream is read on the event loop it was made on "
                               f"(where Engine.stream() was called); this is another")
        self._iterated = True
        return self._tokens()

    async def _tokens(self):
        seen = 0
        try:
            while True:
                count, reason = await self.queue.get()
                if count > seen or reason is not None:
                    yield self.completion.tokens[seen:count], reason  # its tokens only grow
                    seen = count
                if reason is not None:
                    return
        finally:
            if self.completion.finish_reason is None:
                self.engine.cancel(self.completion.id)
