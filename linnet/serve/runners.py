"""How the engine calls a compiled model: one runner per backend.

The engine speaks numpy (token ids, positions, rows); a runner moves them to
the model's device, calls the entries, samples on the device, and gives back
numpy token ids. With `compile`, the torch runner replays decode from static
buffers: a CUDA graph on CUDA, a CPU graph of Linnet's kernels on the CPU
(`kernels.cpu_graph`), eagerly where neither can be captured; the JAX runner
pads every pass to a bucketed length, so that a bounded set of executables
serves a run, and draws inside the decode executable.

A decode step comes back as a `Pending`: its draws stay on the device until
asked for, and can feed the next step as they are. Where the device runs
apart from the host (JAX; torch on CUDA: `looks_ahead`), the engine dispatches
step t + 1 from step t's tokens before it reads them, so the host's work on
step t overlaps the device's on t + 1.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import warnings

import numpy as np

from linnet.serve.sampling import MASK, SHIFT, SPLIT, SamplingBatch, place


def bucket(n: int, smallest: int = 16) -> int:
    """The padded length of a pass of n tokens: the next power of two, at least `smallest`, or three
    quarters of it from 192 on. Passes that arrive while rows decode hold a few prompts, often just
    past a power of two: the quarter steps cut their padding from up to 50% to up to 33%, for one
    more shape to compile per octave.
    """
    size = smallest
    while size < n:
        size *= 2
    if size >= 256 and n <= size * 3 // 4:
        return size * 3 // 4
    return size


def bucket_sizes(limit: int, smallest: int = 16) -> list:
    """Every bucket a pass of up to `limit` tokens can take, ascending: the shapes a JAX warmup
    compiles. Read off `bucket` itself, so the two can never disagree."""
    return sorted({bucket(n, smallest) for n in range(1, max(limit, 1) + 1)})


class Sampled:
    """One pass's draws, on the host: tokens[K], and when logprobs are asked for each one's logprob,
    rank (1 + how many tokens were likelier) and the top alternatives; or a pass's scored prompt
    tokens (`score`), the same for each."""

    def __init__(self, tokens, chosen=None, top_values=None, top_ids=None, ranks=None):
        self.tokens = tokens
        self.chosen = chosen
        self.top_values = top_values
        self.top_ids = top_ids
        self.ranks = ranks


class Pending:
    """A dispatched decode step's draws, not yet read: `tokens` ([Batch], on the device, each row's
    draw at its row) is what the next step takes as its tokens; `result()` waits for the step and
    gives its `Sampled`, request by request as they were passed."""

    def __init__(self, tokens, fetch):
        self.tokens = tokens
        self._fetch = fetch
        self._result = None

    def result(self) -> Sampled:
        if self._result is None:
            self._result = self._fetch()
        return self._result


def logit_adjustments(batch: SamplingBatch, histories: list, vocab: int, k: int, rows=None) -> tuple:
    """The host's arrays that move each sampled request's logits, in k rows (request i in row
    rows[i], default row i), from its (prompt, output, logit_bias, allowed tokens or None), in the
    batch's form (`sampling.MASK`, `sampling.SHIFT`, `sampling.SPLIT`). Masks are packed 32 tokens to
    an int32 (bit j of word w is token 32 w + j, as `structured.Guide.allowed` gives them) and
    unpacked on the device.
    MASK -> (allowed bits i32[k, W],): rows without a mask allow every token.
    SHIFT -> (seen bits i32[k, W], shift f32[k, vocab]): seen, the prompt's and output's tokens
    (which the repetition penalty moves); shift, added after it: the bias, minus each output token's
    count times the frequency penalty and, once it is out, the presence penalty; -inf where a mask bans.
    SPLIT -> (seen bits, bias f32[k, vocab], shift): the bias and the bans in an array of their own,
    added before the repetition penalty (some row has both), the shift the penalties alone.
    Over a 128k vocabulary and 64 rows, a shift is 32 MB a step to fill and send, a mask 1 MB."""
    rows = list(rows) if rows is not None else list(range(len(histories)))
    if batch.adjustment == MASK:
        allowed_bits = np.full((k, mask_words(vocab)), -1, dtype=np.int32)
        for i, (_, _, _, allowed) in zip(rows, histories):
            if allowed is not None:
                allowed_bits[i] = allowed
        return (allowed_bits,)
    seen = np.zeros((k, mask_words(vocab) * 32), dtype=bool)
    shift = np.zeros((k, vocab), dtype=np.float32)
    # SHIFT's one array holds the bias too: no row has both a bias and a repetition penalty
    bias = np.zeros((k, vocab), dtype=np.float32) if batch.adjustment == SPLIT else shift
    for n, (i, (prompt, output, logit_bias, allowed)) in enumerate(zip(rows, histories)):
        seen[i, prompt] = True
        if output:
            seen[i, output] = True
            ids, counts = np.unique(output, return_counts=True)
            shift[i, ids] -= batch.frequency[n] * counts + batch.presence[n]
        if logit_bias:
            bias[i, list(logit_bias)] += np.array(list(logit_bias.values()), dtype=np.float32)
        if allowed is not None:
            bias[i, ~unpack_mask(allowed, vocab)] = -np.inf
    if batch.adjustment == SPLIT:
        return pack_masks(seen), bias, shift
    return pack_masks(seen), shift


def mask_words(vocab: int) -> int:
    """int32 words of a packed token mask over `vocab` tokens."""
    return (vocab + 31) // 32


def pack_masks(masks: np.ndarray) -> np.ndarray:
    """bool[k, 32 W] as packed masks i32[k, W]: bit j of word w is element 32 w + j."""
    return np.packbits(masks, axis=-1, bitorder="little").view("<i4").astype(np.int32)


def unpack_mask(words: np.ndarray, vocab: int) -> np.ndarray:
    """A packed mask's tokens as bool[vocab]."""
    return np.unpackbits(np.asarray(words, "<i4").view(np.uint8), bitorder="little")[:vocab].astype(bool)


def packed_mask(tokens: list, vocab: int) -> np.ndarray:
    """`tokens` as a packed mask over `vocab` tokens (`pack_masks`' layout, a structure's masks')."""
    bits = np.zeros(mask_words(vocab) * 32, dtype=bool)
    bits[np.asarray(tokens, dtype=np.int64)] = True  # (a tuple would index as many axes)
    return pack_masks(bits)


def _cpu_graphs() -> bool:
    from linnet.kernels import cpu_graph

    return cpu_graph.available()


def _first_line(e: Exception) -> str:
    """An exception's message's first line (torch's go on with a C++ trace), or its type's name."""
    return (str(e).splitlines() or [type(e).__name__])[0]


def fuses_decode() -> bool:
    """LINNET_TORCH_INDUCTOR=1: a CUDA decode step goes through torch.compile (Inductor) before it
    is captured, its elementwise ops fused into a few kernels (an experiment, off by default: a
    Llama 3.1 8B step is about 1,400 kernels a replay launches one by one, which held one request
    to 105 tokens/s on an H200; what Inductor's compile costs there is not yet measured)."""
    return os.environ.get("LINNET_TORCH_INDUCTOR", "0") == "1"


def fused_decode(runner, backend: str = "inductor"):
    """The generated model's decode step, compiled whole by torch.compile (no graph breaks: the
    step reads nothing back to the host) for fixed shapes, run in inference mode as the entry is;
    compiled once for the buffers it is called with (the runner's static ones)."""
    import torch

    from linnet.codegen_torch.runtime import before_torch_compile

    before_torch_compile()
    step = torch.compile(functools.partial(type(runner).decode.__wrapped__, runner), fullgraph=True, dynamic=False,
                         backend=backend)

    def decode(tokens, positions):
        with torch.inference_mode():
            return step(tokens, positions)
    return decode


class TorchRunner:
    def __init__(self, model):
        import torch

        from linnet.codegen_torch import runtime as rt
        from linnet.serve.torch_upload import upload

        self.torch = torch
        self._upload = upload  # (torch's modules load with the first torch model, not with this one)
        self.model = model
        self.device = torch.device(model.device)
        self.batch = model.batch
        self.padding = model.max_seq  # one past the cache: a padding token's writes are dropped
        self.compiles = 0
        self.compiled: list = []  # what each compile was, in order (`Stats.compiled`)
        self.use_cuda_graph = self.device.type == "cuda" and model.compile
        self.use_cpu_graph = (self.device.type == "cpu" and model.compile and model.numerics == "fast"
                              and _cpu_graphs())
        self.not_replayed = None  # why decode runs eagerly, where a capture was tried and could not be
        self.rt = rt
        # Linnet's Triton kernels the passes take (each kernel "auto" until a CUDA capture measures
        # it: `kernel_choice`); `kernels_chosen`: how they were chosen, where they were measured
        self.triton = rt.TritonKernels(*(asked is True for asked in rt.TRITON_ASKED))
        self.kernels_chosen = None
        self.looks_ahead = self.device.type == "cuda"  # a CPU tensor op returns when it is done
        # The draw is ops of its own after the step's, so histories given as a function can be asked
        # for once the step has run, the engine computing its structures' masks on a thread meanwhile:
        # where the device runs the step apart from the host. On the CPU the step's kernels take
        # every core, and a thread beside them cost the host more than the masks it made (SmolLM2:
        # 1.3 ms a token more under a JSON schema, 0.6 under a regex; benchmarks/structured_overhead.py)
        self.masks_during_the_step = self.device.type == "cuda"
        self.draws_apart = False  # the draw follows the step in one call (JaxRunner's: decode_alone, draw_after)
        self._graph = None
        self._static_tokens = torch.zeros(self.batch, dtype=torch.int32, device=self.device)
        self._static_positions = torch.zeros(self.batch, dtype=torch.int32, device=self.device)
        self._static_logits = None

    overhead = 0  # packs go to the model as they are

    def stepping(self):
        """Around an engine's steps: on the CPU, where the passes run on Linnet's kernels, torch's
        own ops keep to the stepping thread and the kernels take the cores (`kernels.pool`)."""
        if self.device.type == "cpu" and self.model.numerics == "fast":
            from linnet.kernels import pool

            return pool.kernels_take_the_cores()
        return contextlib.nullcontext()

    @property
    def replays(self) -> bool:
        """Whether decode steps replay a captured graph (CUDA's, or Linnet's on the CPU) rather than
        run eagerly; False before the first step captures."""
        return self._graph not in (None, "eager")

    def chunk_cost(self, n: int) -> int:
        return n

    def chunk_granule(self) -> int:
        return 1

    def _t(self, a):
        return self._upload(a, self.device)

    def prefill(self, tokens, positions, rows, last):
        with self.rt.using_triton(self.triton):
            return self.model.prefill(self._t(tokens), self._t(positions), self._t(rows), self._t(last))

    def _eager_decode(self):
        with self.rt.using_triton(self.triton):
            return self.model.decode(self._static_tokens, self._static_positions)

    def decode(self, tokens, positions):
        """One step over every row, replayed from the captured graph (captured on first use). The
        logits are the graph's own tensor, which the next step overwrites.
        `tokens`: host ids or a tensor on the device (a `Pending`'s)."""
        self._static_tokens.copy_(tokens if isinstance(tokens, self.torch.Tensor) else self._t(tokens))
        self._static_positions.copy_(self._t(positions))
        if self._graph is None:
            return self._capture()
        if self._graph == "eager":
            return self._eager_decode()
        self._graph.replay()
        return self._static_logits

    def _capture(self):
        """Captures decode over the static buffers (a CUDA graph on CUDA, a CPU graph of Linnet's
        kernels on the CPU, `kernels.cpu_graph`), or settles on running it eagerly; returns this
        step's logits. (A capture counts as a compile; settling on eager, with none tried, does not.)"""
        if self.use_cuda_graph or self.use_cpu_graph:
            self.compiles += 1
            self.compiled.append(f"the decode step's capture ({'a CUDA' if self.use_cuda_graph else 'a CPU'} graph)")
        if self.use_cuda_graph:
            self._capture_cuda()
            if self._graph == "eager":
                return self._eager_decode()
            self._graph.replay()
            return self._static_logits
        if self.use_cpu_graph:
            from linnet.kernels import cpu_graph

            with cpu_graph.capture() as graph:  # the capture is this step, run for real
                logits = self._eager_decode()
            if graph.unsupported is None:
                self._graph, self._static_logits = graph, logits
            else:
                self._graph, self.not_replayed = "eager", graph.unsupported
            return logits
        self._graph = "eager"
        return self._eager_decode()

    def _capture_cuda(self):
        from linnet.serve import kernel_choice

        # The capture's warm-up steps and any timing write into the cache: it is saved and restored
        saved = {name: getattr(self.model.runner, name).clone() for name in self.model.runner.state}
        tries = kernel_choice.choices(self.rt.TRITON_ASKED, self.rt.triton_here)
        if len(tries) > 1 and not fuses_decode():  # (Inductor's compile of each would take minutes)
            self._choose_kernels(tries)
        else:
            self.triton = tries[0]
            try:
                self._graph, self._static_logits = self._captured(self.triton)
            except RuntimeError as e:  # an op that reads the device on the host (a mixture's routing without grouped GEMM)
                self._graph, self.not_replayed = "eager", f"CUDA graph capture: {_first_line(e)}"
                warnings.warn(f"the decode step runs eagerly: {self.not_replayed}")
        for name, value in saved.items():
            getattr(self.model.runner, name).copy_(value)

    def _captured(self, kernels):
        """The decode step over the static buffers with these Triton kernels, captured as a CUDA
        graph: (graph, its logits tensor). Raises RuntimeError where it cannot be captured."""
        torch = self.torch
        decode = None
        with self.rt.graph_step(), self.rt.using_triton(kernels):  # the warm-up's kernels chosen as the capture's
            if fuses_decode():
                try:
                    decode = self._warmed(fused_decode(self.model.runner))
                except Exception as e:  # torch.compile's own failures: the step as it is, captured all the same
                    warnings.warn(f"LINNET_TORCH_INDUCTOR: torch.compile failed ({_first_line(e)}); the "
                                  f"decode step is captured as it is")
            if decode is None:
                decode = self._warmed(self.model.decode)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    logits = decode(self._static_tokens, self._static_positions)
            except Exception:  # (the stream's capture ended: the error's caller may run other steps)
                torch.cuda.synchronize()
                raise
        return graph, logits

    def _choose_kernels(self, tries):
        """Times the decode step captured with each of `tries` (runtime.TritonKernels), and a packed
        pass run with and without the small ops where those are tried, over a cache of noise at
        positions spread over MaxSeq; keeps the fastest whose logits agree with the runtime's own
        kernels' (`kernel_choice`). The cache is left to the caller to restore."""
        from linnet.serve import kernel_choice

        inputs = self._static_tokens.clone(), self._static_positions.clone()
        self._probe_inputs()
        captured = {}  # kernels -> (graph, its logits tensor)

        def step(kernels):
            graph, logits = captured[kernels] = self._captured(kernels)
            return graph.replay, lambda: logits
        trials = self._timed(tries, step)
        kept = kernel_choice.fastest(trials)
        self.kernels_chosen = "decode step: " + kernel_choice.describe(trials, kept)
        self.triton = kept.kernels
        passes = sorted({kernels._replace(attention=False) for kernels in tries})  # (a pack takes no Triton attention)
        if len(passes) > 1:  # the small ops in an eager pass: another load (its bytes, not its launches)
            pass_trials = self._timed(passes, self._packed_pass)
            pass_kept = kernel_choice.fastest(pass_trials)
            self.kernels_chosen += "; packed pass: " + kernel_choice.describe(pass_trials, pass_kept)
            self.triton = self.triton._replace(ops=pass_kept.kernels.ops)
        self._static_tokens.copy_(inputs[0])
        self._static_positions.copy_(inputs[1])
        if kept.kernels not in captured:  # not even the runtime's own kernels could be captured
            self._graph, self.not_replayed = "eager", f"CUDA graph capture: {kept.failure}"
            warnings.warn(f"the decode step runs eagerly: {self.not_replayed}")
        else:
            self._graph, self._static_logits = captured[kept.kernels]

    def _probe_inputs(self):
        """The static buffers and the cache set for timing: every row busy at a position spread over
        MaxSeq (the keys a step reads are what its attention's time follows), the cache noise."""
        torch = self.torch
        g = torch.Generator(device=self.device).manual_seed(0)
        for name in self.model.runner.state:
            value = getattr(self.model.runner, name)
            if value.is_floating_point():
                value.normal_(generator=g)
        seq = self.padding
        self._static_tokens.random_(0, self.model.vocab, generator=g)
        self._static_positions.random_(seq // 4, max(seq * 3 // 4, seq // 4 + 1), generator=g)

    def _timed(self, tries, prepare) -> list:
        """kernel_choice.Trial of each of `tries`: prepare(kernels) gives (run, logits()) for a step or
        pass with them, or raises where it cannot (a capture that fails). Each is the median time of
        `run`, and its logits against those of the first that ran (the reference)."""
        from linnet.serve import kernel_choice

        trials, reference = [], None
        for kernels in tries:
            try:
                run, logits = prepare(kernels)
                with self.rt.using_triton(kernels):
                    run()  # (Triton's compile, where the kernels are first called)
            except Exception as e:  # torch's RuntimeError, or Triton's own (TritonError: a compile, a launch refused)
                trials.append(kernel_choice.Trial(kernels, failure=f"{type(e).__name__}: {_first_line(e)}"))
                continue
            with self.rt.using_triton(kernels):
                got = logits().float().clone()
                ms = self._median_ms(run, 5)
            error = 0.0 if reference is None else kernel_choice.relative_error(got, reference)
            reference = got if reference is None else reference
            trials.append(kernel_choice.Trial(kernels, ms, error))
        return trials

    def _packed_pass(self, kernels):
        """(run, logits()) of a packed pass run eagerly: a prompt of up to 512 tokens in row 0, its
        logits at 8 of them (`kernels` are taken around it, by `_timed`)."""
        n = min(512, self.padding)
        pack = (self._t(np.arange(n, dtype=np.int32) % self.model.vocab), self._t(np.arange(n, dtype=np.int32)),
                self._t(np.zeros(n, np.int32)), self._t(np.linspace(0, n - 1, 8).astype(np.int32)))
        out = {}
        return lambda: out.__setitem__("logits", self.model.prefill(*pack)), lambda: out["logits"]

    def _median_ms(self, run, runs: int) -> float:
        """The median time of `run` on the GPU, over `runs` runs, in ms."""
        torch = self.torch
        times = []
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return float(np.median(times))

    def _warmed(self, decode):
        """`decode`, run twice over the static buffers on a side stream, as a capture needs first."""
        torch = self.torch
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                decode(self._static_tokens, self._static_positions)
        torch.cuda.current_stream().wait_stream(stream)
        return decode

    def copy_rows(self, src, dst, upto):
        self.model.copy_rows(self._t(src), self._t(dst), self._t(upto))

    def _draw(self, logits, batch: SamplingBatch, histories, rows):
        """The draws for request i from logits row rows[i] (default: row i), left on the device."""
        from linnet.serve.sampling_torch import sample

        k = len(batch.temperature)
        logits = logits[:k] if rows is None else logits[self._t(np.asarray(rows, np.int64))]
        adjustments = None
        if batch.adjusted and histories is not None:  # a warmup's draw has no histories: it moves nothing
            adjustments = tuple(self._t(a) for a in logit_adjustments(batch, histories, logits.shape[-1], k))
        return sample(logits, batch, adjustments)

    @staticmethod
    def _to_host(tokens, chosen, top, ranks) -> Sampled:
        host = lambda t: None if t is None else t.cpu().numpy()
        return Sampled(host(tokens), host(chosen), None if top is None else host(top[0]),
                       None if top is None else host(top[1]), host(ranks))

    def sample(self, logits, batch: SamplingBatch, histories=None, rows=None) -> Sampled:
        """Draws for request i from logits row rows[i] (default: row i)."""
        return self._to_host(*self._draw(logits, batch, histories, rows))

    def score(self, logits, start: int, targets: list, k: int) -> Sampled:
        """The logprob and rank of targets[i] under logits row start + i, and that row's k best."""
        from linnet.serve.sampling_torch import score

        targets = self._t(np.asarray(targets, np.int64))
        chosen, ranks, top = score(logits[start:start + len(targets)], targets, k)
        return self._to_host(targets, chosen, top, ranks)

    def decode_sample(self, tokens, positions, batch: SamplingBatch, rows, histories=None) -> Pending:
        """A decode step over every row (tokens: host ids, or a `Pending`'s), then the draws for
        request i from row rows[i]; `histories`, or a function giving them, called once the step
        has run (`masks_during_the_step`)."""
        logits = self.decode(tokens.tokens if isinstance(tokens, Pending) else tokens, positions)
        histories = histories() if callable(histories) else histories
        drawn = self._draw(logits, batch, histories, rows)
        by_row = self._static_tokens.clone()  # rows not drawn for keep their token: their position is padding
        by_row[self._t(np.asarray(rows, np.int64))] = drawn[0]
        return Pending(by_row, lambda: self._to_host(*drawn))

    def warmup(self, pack_lengths, modes, scoring: bool = False):
        """Runs every pass size given, a decode step, and over its logits the draws for each (sampling
        batch, its histories or None) in `modes`. (`scoring`: JAX's; torch's shapes need nothing made
        ahead.) The decode step first: its capture chooses the kernels the passes then warm up with.
        One step: each after it replays the same graph whatever the draw (a server's warmup stepped
        16 times, 0.05 s each for SmolLM2 on a quiet CPU); each draw still runs, torch's eager ops,
        which compile nothing but load their kernels on first use."""
        logits = self.decode(np.zeros(self.batch, np.int32), np.full(self.batch, self.padding, np.int32))
        for batch, histories in modes:
            self._to_host(*self._draw(logits, batch, histories, list(range(len(batch.temperature)))))
        for n in sorted(set(pack_lengths)):
            self.prefill(np.zeros(n, np.int32), np.full(n, self.padding, np.int32), np.zeros(n, np.int32),
                         np.zeros(1, np.int32))


class JaxRunner:
    stepping = contextlib.nullcontext  # (its kernels run on XLA's pool)

    def __init__(self, model, smallest_bucket: int = 16):
        self.model = model
        self.batch = model.batch
        self.smallest = smallest_bucket
        self.padding = model.max_seq  # one past the cache: a padding token's writes are dropped
        from linnet.codegen_jax.runtime import head_tokens

        self.overhead = head_tokens(self.batch)  # every pack starts with this many one-token slots
        self.compiled: list = []  # what the calls that compiled were, in order (`Stats.compiled`)
        _xla_compiles()  # listening from here on

    looks_ahead = True  # an executable's call returns before it has run (JAX's async dispatch)
    masks_during_the_step = False  # no thread of the engine's: the draws apart below serve structures
    # A step whose draws need the host's work (a structure's masks, which follow the token drawn;
    # penalties' counts) sends the model's decode alone (`decode_alone`), the host doing that work
    # while it runs, then the draw (`draw_after`): the engine's `_decode_ahead` and `_dispatch`
    draws_apart = True

    @property
    def compiles(self) -> int:
        """XLA compilations in this process so far, whatever asked for them: counted as XLA reports
        them, so that a run compiling anything after its warmup (a new shape, or an argument on
        another device placement) shows."""
        return _xla_compiles()

    def prefill(self, tokens, positions, rows, last):
        """The logits at `last`, in [Batch, vocab]; or, where a pass scores a prompt's tokens and
        wants more rows than Batch, in as many rows as the padded pass has tokens."""
        tokens, positions, rows, last = self.align(tokens, positions, rows, last)
        size = bucket(len(tokens), self.smallest)
        pad = size - len(tokens)
        tokens = np.concatenate([tokens, np.zeros(pad, np.int32)]).astype(np.int32)
        positions = np.concatenate([positions, np.full(pad, self.padding, np.int32)]).astype(np.int32)
        rows = np.concatenate([rows, np.zeros(pad, np.int32)]).astype(np.int32)
        # A pass that scores prompt tokens (prompt_logprobs) has a row of logits for each of its tokens:
        # one executable a pass size, as many as `warmup` can compile.
        wanted = self.batch if len(last) <= self.batch else size
        last = np.concatenate([last, np.zeros(wanted - len(last), np.int32)]).astype(np.int32)
        scoring = f", its logits at all {size} (prompt_logprobs)" if wanted > self.batch else ""
        with self._naming(f"a packed pass of {size} tokens{scoring}"):
            return self.model.prefill(tokens, positions, rows, last)

    @contextlib.contextmanager
    def _naming(self, what: str):
        """Notes `what` in `compiled` where XLA compiled during it: a run after a warmup that
        missed a pass size or a draw's form says which (its count alone said only how many)."""
        before = _xla_compiles()
        try:
            yield
        finally:
            made = _xla_compiles() - before
            if made > 0:
                self.compiled.append(what if made == 1 else f"{what} ({made} executables)")

    def align(self, tokens, positions, rows, last):
        """Lays a pack out for the JAX attention (linnet.codegen_jax.runtime.attention): one-token
        segments first, padded to `head_tokens(rows)`; then each longer segment padded to a
        multiple of BLOCK. Padding tokens sit at position MaxSeq: they write nothing and widen no attention span.
        """
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        ends = np.r_[starts[1:], len(rows)]
        singles = [s for s, e in zip(starts, ends) if e - s == 1]
        runs = [(s, e) for s, e in zip(starts, ends) if e - s > 1]
        where = np.zeros(len(rows), np.int64)
        head = self.overhead
        where[singles] = np.arange(len(singles))
        out_t = [tokens[singles], np.zeros(head - len(singles), np.int32)]
        out_p = [positions[singles], np.full(head - len(singles), self.padding, np.int32)]
        out_r = [rows[singles], np.zeros(head - len(singles), np.int32)]
        at = head
        for s, e in runs:
            n = e - s
            padded = self.chunk_cost(n)
            where[s:e] = np.arange(at, at + n)
            out_t += [tokens[s:e], np.zeros(padded - n, np.int32)]
            out_p += [positions[s:e], np.full(padded - n, self.padding, np.int32)]
            out_r.append(np.full(padded, rows[s], np.int32))
            at += padded
        return (np.concatenate(out_t).astype(np.int32), np.concatenate(out_p).astype(np.int32),
                np.concatenate(out_r).astype(np.int32), where[last].astype(np.int32))

    # What a pass costs in padded tokens, so the engine packs within its budget.
    def chunk_cost(self, n: int) -> int:
        from linnet.codegen_jax.runtime import BLOCK

        return 0 if n == 1 else -(-n // BLOCK) * BLOCK

    def chunk_granule(self) -> int:
        from linnet.codegen_jax.runtime import BLOCK

        return BLOCK

    def decode_sample(self, tokens, positions, batch: SamplingBatch, rows, histories=None) -> Pending:
        """A decode step over every row (tokens: host ids, or a `Pending`'s), then the draws for
        request i from row rows[i]: one executable, whose logits never leave it. Every row is drawn
        for (a row without a request repeats request 0's settings), so that one executable serves
        every step and the draws come back laid out by row. A batch whose draws the host's arrays
        move (`histories`: masks, penalties, a bias) goes as `decode_alone`, then `draw_after`:
        those executables serve its steps sent ahead anyway, and a decode fused with each form's
        draw was three more decode steps for a warmup to compile (SmolLM2 on this CPU: 4.8 of 33 s)."""
        from linnet.serve.sampling_jax import arguments, sampler

        if batch.adjusted and histories is not None:  # (a warmup's draw has no histories: it moves nothing)
            return self.draw_after(self.decode_alone(tokens, positions), batch, rows, histories)
        rows = list(rows)
        placed = place(batch, rows, self.batch)
        tokens = tokens.tokens if isinstance(tokens, Pending) else np.asarray(tokens, np.int32)
        with self._naming("the decode step and its draw"):
            drawn = self.model.call_then("decode", sampler(None), (tokens, np.asarray(positions, np.int32)),
                                         arguments(placed))
        if batch.logprobs < 0:  # the logprobs' zeros stay on the device
            drawn = (drawn[0], None, None, None, None)
        return Pending(drawn[0], lambda: self._to_host(drawn, rows))

    def decode_alone(self, tokens, positions):
        """The model's decode step over every row (tokens: host ids, or a `Pending`'s), sent without
        a draw: its logits [Batch, vocab], still on the device, for `draw_after`. Its call returns
        at once, so the host can settle the step before it and make the masks meanwhile."""
        tokens = tokens.tokens if isinstance(tokens, Pending) else np.asarray(tokens, np.int32)
        with self._naming("the decode step alone (its draw apart, after the host's masks or counts)"):
            return self.model.decode(tokens, np.asarray(positions, np.int32))

    def draw_after(self, logits, batch: SamplingBatch, rows, histories=None) -> Pending:
        """The draws for request i from row rows[i] of a `decode_alone`'s logits, as `sample` draws
        after a packed pass: the same executable a form (and the same as inside the decode step's),
        so the same tokens; laid out by row, as `decode_sample`'s."""
        rows = list(rows)
        drawn = self._draw(logits, batch, rows, histories, "the draw after a decode step")
        return Pending(drawn[0], lambda: self._to_host(drawn, rows))

    def _draw(self, logits, batch: SamplingBatch, rows: list, histories, what: str) -> tuple:
        """The draws over a pass's first Batch rows of logits, request i's from row rows[i] (`sampling_jax.sample`,
        one executable a form, named `what` where it compiles), still on the device: (tokens,
        chosen, top values, top ids, ranks), as `_to_host` takes them."""
        from linnet.serve.sampling_jax import first_rows, mode, sample

        placed = place(batch, rows, self.batch)
        adjustments = None
        if batch.adjusted and histories is not None:
            adjustments = logit_adjustments(batch, histories, self.model.vocab, self.batch, rows)
        if logits.shape[0] != self.batch:  # a pass that also scored prompt tokens: draws come from its first rows
            with self._naming(f"the first {self.batch} rows of a pass's {logits.shape[0]} rows of logits "
                              f"(prompt_logprobs)"):
                logits = first_rows(logits, self.batch)
        with self._naming(f"{what}{_FORM_NAMES[mode(placed, adjustments)]}"):
            tokens, chosen, top, ranks = sample(logits, placed, adjustments)
        return (tokens, chosen, *(top if top is not None else (None, None)), ranks)

    @staticmethod
    def _to_host(drawn, rows) -> Sampled:
        """`drawn`: (tokens, chosen, top values, top ids, ranks), each by row or None."""
        return Sampled(*(None if a is None else np.asarray(a)[rows] for a in drawn))

    def copy_rows(self, src, dst, upto):
        k = len(src)
        fill = lambda a: np.concatenate([a, np.full(self.batch - k, a[0], np.int32)]).astype(np.int32)
        with self._naming("the copy of a shared prefix between rows"):
            self.model.copy_rows(fill(src), fill(dst), fill(upto))

    def sample(self, logits, batch: SamplingBatch, histories=None, rows=None) -> Sampled:
        """Draws for request i from logits row rows[i] (default: row i), always over all the rows
        of `logits` ([Batch, vocab] here), so that one executable serves every step."""
        rows = list(range(len(batch.temperature))) if rows is None else list(rows)
        return self._to_host(self._draw(logits, batch, rows, histories, "the draw after a packed pass"), rows)

    def score(self, logits, start: int, targets: list, k: int) -> Sampled:
        """The logprob and rank of targets[i] under logits row start + i, and that row's k best:
        computed over every row of `logits`, and always the most alternatives any request may ask
        for (the engine keeps each request's k), so that one executable serves each row count."""
        from linnet.serve.request import MAX_LOGPROBS
        from linnet.serve.sampling_jax import score

        padded = np.zeros(logits.shape[0], np.int32)
        padded[start:start + len(targets)] = targets
        with self._naming(f"the scores of prompt tokens over {logits.shape[0]} rows of logits (prompt_logprobs)"):
            chosen, ranks, top = score(logits, padded, MAX_LOGPROBS)
        at = slice(start, start + len(targets))
        values, ids = (None, None) if top is None else (np.asarray(top[0])[at], np.asarray(top[1])[at])
        return Sampled(padded[at], np.asarray(chosen)[at], values, ids, np.asarray(ranks)[at])

    def compile_scoring(self, sizes) -> None:
        """Compiles, without running anything, what a pass that scores prompt tokens (prompt_logprobs)
        runs at each of `sizes`: past Batch tokens, the pass with a row of logits for each of its
        tokens, the scores over those rows and their first Batch rows (the draws'); and the scores
        over a usual pass's Batch rows. The draws are a usual pass's (`warmup`'s modes). Running
        nothing, it may go on a thread beside the engine's steps (`Engine.warm_scoring_later`); run,
        the warmup's passes of 512 tokens scored every padding token's logits for nothing."""
        import jax

        from linnet.serve.request import MAX_LOGPROBS
        from linnet.serve.sampling_jax import compile_first_rows, compile_score

        def placed(executable):  # its logits as a pass leaves them (shape, type, placement)
            logits = executable.out_info[0]
            return jax.ShapeDtypeStruct(logits.shape, logits.dtype, sharding=logits.sharding)
        sizes = sorted(set(sizes))
        if not sizes:
            return
        compile_ahead = self.model.runner.compile_ahead
        scored = [size for size in sizes if size > self.batch]
        usual = compile_ahead("prefill", [self._padding_args(sizes[0], self.batch)])  # (compiled by the warmup)
        passes = compile_ahead("prefill", [self._padding_args(size, size) for size in scored])
        compile_score(placed(usual[0]), MAX_LOGPROBS)
        for executable in passes:
            compile_score(placed(executable), MAX_LOGPROBS)
            compile_first_rows(placed(executable), self.batch)

    def pass_sizes(self, budget: int) -> list:
        """The buckets of passes up to `budget` tokens: none below the head of one-token slots that
        starts every pass (64 rows' head: 64 tokens, so no 16- or 32-token pass to compile)."""
        least = bucket(self.overhead, self.smallest)
        return [size for size in bucket_sizes(budget, self.smallest) if size >= least]

    def _padding_args(self, size: int, logit_rows: int) -> tuple:
        """A pass of `size` padding tokens (they write nothing), with `logit_rows` rows of logits."""
        return (np.zeros(size, np.int32), np.full(size, self.padding, np.int32), np.zeros(size, np.int32),
                np.zeros(logit_rows, np.int32))

    def warmup(self, pack_lengths, modes, scoring: bool = False):
        """Compiles every pass size given, copy_rows, and for each (sampling batch, its histories or
        None) in `modes` the decode step that draws so and the draw after a prefill; with `scoring`,
        also what a pass scoring prompt tokens runs at each size (`compile_scoring`)."""
        sizes = sorted({bucket(n, self.smallest) for n in pack_lengths})
        # every size's pass compiled at once (on a GPU each took up to 50 s, one after another), and
        # the least run, for logits to warm the draws over: a pass's first run is no slower than its
        # next (SmolLM2, 8 rows: 28 ms to 573 ms from 16 to 512 tokens, the same again); running
        # every size held the server's warmup 1.1 s longer
        self.model.runner.compile_ahead("prefill", [self._padding_args(size, self.batch) for size in sizes])
        logits = self.model.prefill(*self._padding_args(sizes[0], self.batch)) if sizes else None
        if scoring:
            self.compile_scoring(sizes)
        self.copy_rows(np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32))
        idle = np.full(self.batch, self.padding, np.int32)
        for batch, histories in modes:
            rows = list(range(len(batch.temperature)))
            # (a form that moves logits: the decode alone and its draw apart, as a structured step goes)
            self.decode_sample(np.zeros(self.batch, np.int32), idle, batch, rows, histories).result()
            if logits is not None:
                self.sample(logits, batch, histories, rows=rows)


# How `JaxRunner.compiled` names a draw's form (`sampling_jax.mode`)
_FORM_NAMES = {None: "", MASK: ", with token masks (structured outputs, allowed_token_ids)",
               SHIFT: ", with penalties or a logit bias", SPLIT: ", with a logit bias and a repetition penalty"}

_COMPILES = [0, False]  # XLA compilations seen (less those read back from the persistent cache), and whether the listeners are in
# True where compiles are made ahead beside the steps (`Engine.warm_scoring_later`): not the steps' own
_UNCOUNTED = contextvars.ContextVar("linnet_uncounted_compiles", default=False)


@contextlib.contextmanager
def uncounted():
    """XLA compilations in this context (and in the threads `JaxModel.compile_ahead` starts from it)
    are left out of `JaxRunner.compiles`: made ahead, on a thread of their own, no step waited on them."""
    token = _UNCOUNTED.set(True)
    try:
        yield
    finally:
        _UNCOUNTED.reset(token)


def _xla_compiles() -> int:
    if not _COMPILES[1]:
        import jax

        def heard(event: str, seconds: float, **kwargs):
            if event == "/jax/core/compile/backend_compile_duration" and not _UNCOUNTED.get():
                _COMPILES[0] += 1

        def read_back(event: str, **kwargs):  # timed as a compile, but read from the persistent cache
            if event == "/jax/compilation_cache/cache_hits" and not _UNCOUNTED.get():
                _COMPILES[0] -= 1
        jax.monitoring.register_event_duration_secs_listener(heard)
        jax.monitoring.register_event_listener(read_back)
        _COMPILES[1] = True
    return _COMPILES[0]


def make_runner(model):
    return TorchRunner(model) if model.backend == "torch" else JaxRunner(model)
