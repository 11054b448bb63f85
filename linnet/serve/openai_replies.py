"""OpenAI's replies: a job's finished or streaming choices as the bodies and chunks OpenAI gives.

Pure functions, no I/O, the counterpart of openai_api.py (which reads a body into a `Job`): a
choice's text as its tokens decode (`TextStream`), its logprobs in each endpoint's form, a chat
choice's message (a reasoning model's thinking apart, tool calls read by the job's parser) and
the whole response (`completion_response`, `chat_response`) or its server-sent chunks
(`ChunkWriter`).
"""

from __future__ import annotations

import time
import uuid

from linnet.serve.openai_api import Job
from linnet.serve.tool_stream import CallStream


def read_tool_calls(job: Job, text: str) -> tuple:
    """(content, tool calls as OpenAI gives them, or None) of a chat choice's text: no calls where
    the text makes none, or was cut short in one."""
    content, calls = job.tool_parser.parse(text)
    if not calls:
        return text, None
    return content, [{"id": job.call_id(), "type": "function", "function": c} for c in calls]


def _call_text(job: Job, text: str) -> str | None:
    """The part of a chat choice's text its tool parser reads: the answer, past a reasoning model's
    thinking (None while it thinks), but for a parser that reads the whole reply (harmony)."""
    if getattr(job.tool_parser, "reads_whole_reply", False):
        return text
    answer = answer_start(job, text)  # 0 without a reasoning parser
    return None if answer is None else text[answer:]


def answer_start(job: Job, text: str) -> int | None:
    """Where a chat reply's answer begins in its text: 0, past a reasoning model's thinking (None
    while it thinks)."""
    return 0 if job.reasoning is None else job.reasoning.content_start(text)


def calls_start(job: Job, text: str, ended: bool = False) -> int | None:
    """Where a chat reply's tool calls begin in its text: its answer's start for a forced call, the
    tool parser's first call's with "auto"; None where none has begun (or still thinking), and for
    a parser reading the whole reply (harmony's calls are messages apart from its answer). `ended`:
    the reply is whole, and where it makes no call after all (a Llama 3 reply that ends on "{"
    began none), None, as `chat_message` reads it."""
    if job.tool_call is None or getattr(job.tool_parser, "reads_whole_reply", False):
        return None
    answer = answer_start(job, text)
    start = calls_after(job, text, answer)
    if ended and start is not None and job.tool_call == "auto":
        calls = job.tool_parser.parse(text[answer:])[1] or _calls_so_far(job, text[answer:])[1]
        return start if calls else None
    return start


def calls_after(job: Job, text: str, answer: int | None) -> int | None:
    """`calls_start` of a job with tools that its parser reads from the answer, where the answer
    starts at `answer` (`answer_start`)."""
    if answer is None or job.tool_call != "auto":
        return answer
    start = job.tool_parser.call_start(text[answer:])
    return None if start is None else answer + start


def divide_reply(job: Job, text: str, start: int, stop: int) -> tuple:
    """text[start:stop] of a reply as (thinking, answer): all answer but for a reasoning model."""
    return ("", text[start:stop]) if job.reasoning is None else job.reasoning.divide(text, start, stop)


def partial_calls(job: Job, text: str, upto: int) -> list:
    """The tool calls text[:upto] of a chat choice is writing, as its tool parser reads them
    (`partial`): [(name or None, arguments so far or None, closed)]; none without tools (the
    text is not even cut then: a stream's every step asks). A parser whose calls are known only
    once the reply is whole (`sends_calls_at_end`) sends none before."""
    if getattr(job.tool_parser, "sends_calls_at_end", False):
        return []
    source = None if job.tool_call is None else _call_text(job, text[:upto])
    return [] if source is None else job.tool_parser.partial(source)


def new_id(prefix: str, sep: str = "-") -> str:
    """chatcmpl-..., cmpl-... as OpenAI's; its Responses API writes resp_..., msg_... (`sep` "_")."""
    return f"{prefix}{sep}{uuid.uuid4().hex[:24]}"


def usage(job: Job, comps: list) -> dict:
    """OpenAI's usage: each prompt counted once, with the tokens of it the cache held (read off the
    copy that prefilled it: the others copy it whole but for its last token)."""
    completion = sum(len(c.tokens) for c in comps)
    cached = sum(c.cached_tokens for i, c in enumerate(comps) if i % job.n == 0)
    return {"prompt_tokens": job.prompt_tokens, "completion_tokens": completion,
            "total_tokens": job.prompt_tokens + completion, "prompt_tokens_details": {"cached_tokens": cached}}


def choice_usage(comp, streamed: int) -> dict:
    """The usage a streamed chunk carries with vLLM's continuous_usage_stats: its choice's own, the
    choice's prompt and the `streamed` tokens of it sent so far (the last chunk's, `usage`, counts
    every choice)."""
    prompt = len(comp.request.prompt)
    return {"prompt_tokens": prompt, "completion_tokens": streamed, "total_tokens": prompt + streamed}


def _token_text(tokenizer, token_ids: bool = False):
    """A token's name in logprobs: its text, or with `token_ids` (vLLM's return_tokens_as_token_ids,
    for clients that must know the very ids drawn) "token_id:ID"."""
    if token_ids:
        return lambda t: f"token_id:{t}"
    return (lambda t: tokenizer.decode([t])) if tokenizer else str


class TextStream:
    """A choice's text as its tokens come, decoded after `context` (its prompt's ids), holding back
    what may yet turn out to be one of `stops`. `start`: where the text begins in the response's
    (past an echoed prompt), for the tokens' text offsets."""

    def __init__(self, tokenizer, context: list = (), stops: list = (), start: int = 0, special: bool = False,
                 markers: dict | None = None):
        """`special`: keep the special tokens' text (a reply whose markers are special tokens, harmony's);
        `markers`: {id: text} of special tokens written though others are dropped (`marker_ids`)."""
        self.decoder = (tokenizer.incremental_decoder(skip_special_tokens=not special, context=context)
                        if tokenizer else None)
        self.markers = {} if special else dict(markers or {})
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.start = start
        self.text = ""
        self.sent = 0
        self.tokens = 0  # how many have been added

    def add(self, tokens: list) -> list:
        """Decodes `tokens` onto the text; returns where each one's text starts."""
        at = []
        for t in tokens:
            at.append(self.start + len(self.text))
            if self.decoder is None:
                continue
            if t in self.markers:  # what the decoder holds goes first; the marker stays its context
                held = self.decoder.flush()
                self.decoder.push(t)
                self.text += held + self.markers[t]
            else:
                self.text += self.decoder.push(t)
        self.tokens += len(tokens)
        return at

    def ready(self, upto: int | None = None) -> str:
        """The text not sent yet that can no longer turn out to be a stop string (nor pass `upto`)."""
        return self._emit(min(len(self.text) - self.hold, len(self.text) if upto is None else upto))

    def push(self, tokens: list) -> str:
        self.add(tokens)
        return self.ready()

    def finish(self, final_text: str | None) -> str:
        """The rest of the text: the engine's final text (cut at a stop string) where it has one;
        a character the last tokens stop inside is left out, not ended in U+FFFD."""
        if self.decoder is not None:
            self.text += self.decoder.finish()
        if final_text is not None:
            self.text = final_text
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        out = self.text[self.sent:upto]
        self.sent = upto
        return out


def choice_stream(job: Job, comp, tokenizer, start: int = 0, markers: dict | None = None) -> TextStream:
    """A choice's text as a stream decodes it: special tokens kept where its request keeps them
    (harmony's markers), else only the tool parser's markers (`marker_ids`, passed in where known)."""
    markers = marker_ids(job, tokenizer) if markers is None else markers
    return TextStream(tokenizer, comp.request.prompt, comp.request.stop, start, not comp.request.skip_special_tokens,
                      markers)


def completion_logprobs(lps: list, tokenizer, offsets: list, prompt: tuple | None = None,
                        token_ids: bool = False) -> dict:
    """OpenAI's legacy logprobs for some tokens of a choice; `offsets`: where each one's text starts.
    `prompt`: an echoed prompt's (ids, scores, offsets), whose tokens lead, the first without a logprob.
    Each token's alternatives hold the token itself too ("up to logprobs + 1 elements", as OpenAI's
    and vLLM's: first, as vLLM's)."""
    text = _token_text(tokenizer, token_ids)
    ids, scores, before = prompt if prompt is not None else ([], [], [])
    every = list(zip(ids, scores)) + [(lp.token, lp) for lp in lps]
    return {"tokens": [text(t) for t, _ in every],
            "token_logprobs": [None if lp is None else lp.logprob for _, lp in every],
            "top_logprobs": [None if lp is None else {text(lp.token): lp.logprob, **{text(t): v for t, v in lp.top}}
                             for _, lp in every],
            "text_offset": list(before) + list(offsets)}


def vllm_prompt_logprobs(scores: list, tokenizer) -> list:
    """vLLM's prompt_logprobs: per prompt token, None (the first) or {id: {logprob, rank, decoded_token}}
    holding the token itself and its top alternatives."""
    text = _token_text(tokenizer)
    out = []
    for lp in scores:
        if lp is None:
            out.append(None)
            continue
        entry = {str(t): {"logprob": v, "rank": r, "decoded_token": text(t)} for r, (t, v) in enumerate(lp.top, 1)}
        entry[str(lp.token)] = {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": text(lp.token)}
        out.append(entry)
    return out


def chat_logprobs(lps: list, tokenizer, token_ids: bool = False) -> dict:
    """OpenAI's chat logprobs; each token's `bytes` whole where its text ends inside a character."""
    text = _token_text(tokenizer, token_ids)
    raw = (lambda t: tokenizer.token_bytes(t)) if hasattr(tokenizer, "token_bytes") else \
        (lambda t: _token_text(tokenizer)(t).encode())
    entry = lambda t, v: {"token": text(t), "logprob": v, "bytes": list(raw(t))}
    return {"content": [dict(entry(lp.token, lp.logprob), top_logprobs=[entry(t, v) for t, v in lp.top])
                        for lp in lps]}


def finish_reason(comp) -> str | None:
    return {"cancelled": "stop"}.get(comp.finish_reason, comp.finish_reason)


def _text(comp) -> str:
    return comp.text if comp.text is not None else ""  # no tokenizer: the token ids are all there is


def echoed_prompt(job: Job, comps: list, i: int, tokenizer) -> tuple | None:
    """Choice i's prompt (ids, scores, offsets) where it leads the choice's logprobs (echo with logprobs)."""
    if not job.echo_logprobs:
        return None
    ids = comps[i].request.prompt
    special = bool(job.echo_special and job.echo_special[i])
    return ids, job.prompt_scores(comps, i), TextStream(tokenizer, special=special).add(ids)  # offsets in the echo


def completion_response(job: Job, comps: list, model: str, tokenizer) -> dict:
    choices = []
    for i, comp in enumerate(comps):
        before = job.echo[i] if job.echo else ""
        logprobs = None if comp.request.logprobs is None else completion_logprobs(
            comp.logprobs, tokenizer,
            TextStream(tokenizer, comp.request.prompt, comp.request.stop, len(before)).add(comp.tokens),
            echoed_prompt(job, comps, i, tokenizer), job.token_ids)
        choice = {"index": i, "text": before + _text(comp), "logprobs": logprobs, "finish_reason": finish_reason(comp),
                  "stop_reason": comp.stop_reason}
        if job.prompt_logprobs:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(job.prompt_scores(comps, i), tokenizer)
        choices.append(choice)
    return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage(job, comps)}


def chat_message(job: Job, comp, tokenizer) -> tuple:
    """A chat choice's (message, finish_reason): its text, or the tool calls it makes; a reasoning
    model's thinking apart, as `reasoning_content`."""
    text = reply_text(job, comp, tokenizer)
    message = {"role": "assistant", "content": text}
    if job.reasoning is not None:
        message["reasoning_content"], message["content"] = job.reasoning.split(text)
        if not job.include_reasoning:  # read apart all the same: the answer is what follows the thinking
            del message["reasoning_content"]
    content, calls, finish = None, None, "tool_calls"
    if job.tool_call is not None:
        source = text if getattr(job.tool_parser, "reads_whole_reply", False) else message["content"]
        if source is not None:
            content, calls = read_tool_calls(job, source)
        if calls is None and source is not None and _cut_short(comp):  # in a call: as far as it was written
            content, calls, finish = _calls_so_far(job, source) + (finish_reason(comp),)
        if calls is None and source is not None and _forced_call_begun(job, source):
            return dict(message, content=None), finish_reason(comp)
    if calls is None:
        return message, finish_reason(comp)
    if job.tool_call not in ("auto", "required"):  # a named function's call ends as "stop", as OpenAI's and vLLM's
        finish = finish_reason(comp)
    elif job.tool_call == "required" and finish_reason(comp) != "stop":
        finish = finish_reason(comp)  # vLLM's: "required" says "tool_calls" only for a reply that ended by itself
    return dict(message, content=content, tool_calls=calls), finish


def _cut_short(comp) -> bool:
    """Whether a reply was cut before it ended by itself: by its token limit, its client, or a stop
    string or token it asked for. A reply that ended by itself with calls that do not read is its
    text, as vLLM gives it: calls whose arguments are no JSON are no calls to make."""
    return comp.finish_reason != "stop" or comp.stop_reason is not None


def _forced_call_begun(job: Job, text: str) -> bool:
    """Whether a reply tool_choice forced ("required": a JSON list of calls; a named function: its arguments)
    is that structure's text, cut before a call could be read from it (`[{"name": "get_w`): no answer of the
    model's, so no content, as its stream sent none; not where the structure never held (a reasoning model's
    reply that did not close its thinking)."""
    if job.tool_call in (None, "auto") or getattr(job.tool_parser, "reads_whole_reply", False):
        return False
    return text.lstrip()[:1] in ("", "[" if job.tool_call == "required" else "{")


def _calls_so_far(job: Job, text: str) -> tuple:
    """(content, calls or None) of a reply whose calls do not all read whole (cut short by its
    token limit, say): the calls as far as a stream sends them, each once its name is written,
    its arguments as far as written, as OpenAI gives a call cut short; the text before them the
    content. So a reply reads the same streamed and whole."""
    parser = job.tool_parser
    whole = getattr(parser, "reads_whole_reply", False)
    start = parser.call_start(text) if hasattr(parser, "call_start") and not whole else 0
    if start is None:  # the text is no call after all (a pythonic list with text after it)
        return text, None
    stream = CallStream(job.call_id, job.tool_names)
    stream.news(parser.partial(text))
    if not stream.sent:
        return text, None
    calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in stream.sent]
    return (parser.split(text)[1] if whole else text[:start] or None), calls


def marker_ids(job: Job, tokenizer) -> dict:
    """{token id: text} of the special tokens the job's tool parser reads (Mistral's [TOOL_CALLS],
    [ARGS]): written into a reply's text where special tokens are otherwise dropped."""
    if tokenizer is None:
        return {}
    found = ((tokenizer.token_to_id(m), m) for m in getattr(job.tool_parser, "markers", ()))
    return {i: m for i, m in found if i is not None}


def reply_text(job: Job, comp, tokenizer) -> str:
    """A chat choice's text as its parsers read it: the engine's (cut at a stop string; a harmony
    reply's with its markers, as its request keeps special tokens), with the tool parser's
    markers written where the model drew them."""
    text, markers = _text(comp), marker_ids(job, tokenizer)
    tokens = list(comp.tokens)
    if not markers or not markers.keys() & set(tokens):
        return text
    out, seen, start = "", list(comp.request.prompt), 0
    left = len(text)  # the text may have been cut at a stop string: the marked text is cut where it is
    cut = isinstance(comp.stop_reason, str)
    for at in [i for i, t in enumerate(tokens) if t in markers] + [len(tokens)]:
        piece = tokenizer.decode_after(seen, tokens[start:at], skip_special_tokens=True)[:left]
        out, left = out + piece, left - len(piece)
        if at == len(tokens) or cut and left == 0:  # the end, or a stop string's cut before this marker
            return out
        out += markers[tokens[at]]
        seen, start = seen + tokens[start:at + 1], at + 1
    return out


def chat_response(job: Job, comps: list, model: str, tokenizer) -> dict:
    choices = []
    for i, comp in enumerate(comps):
        message, reason = chat_message(job, comp, tokenizer)
        if job.echo:
            message["content"] = job.echo[i] + (message["content"] or "")
        choices.append({"index": i, "message": message, "finish_reason": reason, "stop_reason": comp.stop_reason,
                        "logprobs": None if comp.request.logprobs is None else
                        chat_logprobs(comp.logprobs, tokenizer, job.token_ids)})
    response = {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": choices, "usage": usage(job, comps)}
    if job.prompt_logprobs:  # one prompt: vLLM gives its logprobs once, beside the choices
        response["prompt_logprobs"] = vllm_prompt_logprobs(job.prompt_scores(comps, 0), tokenizer)
    return response


class ChunkWriter:
    """The server-sent chunks of one streamed response, for either endpoint."""

    def __init__(self, chat: bool, model: str, tokenizer, include_usage: bool, usage_so_far=None,
                 token_ids: bool = False):
        """`usage_so_far(i)`: makes the usage a chunk of choice i carries (continuous_usage_stats,
        `choice_usage`); else a chunk's is null but the last's. `token_ids`: logprobs name tokens by
        id (`_token_text`)."""
        self.token_ids = token_ids
        self.chat, self.model, self.tokenizer = chat, model, tokenizer
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.include_usage = include_usage
        self.usage_so_far = usage_so_far

    def _chunk(self, choices: list, **extra) -> dict:
        chunk = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.model, "choices": choices}
        if self.include_usage:
            chunk["usage"] = (extra["usage"] if "usage" in extra else
                              self.usage_so_far(choices[0]["index"]) if self.usage_so_far else None)
        return chunk

    def start(self, index: int) -> dict | None:
        """Chat opens each choice with the assistant's role; completions have no opening."""
        if not self.chat:
            return None
        return self._chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}])

    def piece(self, index: int, text: str, lps: list | None = None, offsets: list | None = None,
              reason: str | None = None, prompt: tuple | None = None, reasoning: str = "",
              reply: tuple | None = None, stop_reason: int | str | None = None) -> dict:
        """New text of choice `index` (and its tokens' logprobs, when asked for), or its end (with
        what stopped it, `Completion.stop_reason`);
        `prompt`: an echoed prompt's (ids, scores, offsets), whose logprobs lead; `reasoning`: new
        thinking of a reasoning model (chat). `reply` is for `ResponseWriter`: a chunk's logprobs
        are all its tokens', thinking's too (as vLLM's)."""
        if self.chat:
            logprobs = None if lps is None else chat_logprobs(lps, self.tokenizer, self.token_ids)
            delta = {"reasoning_content": reasoning} if reasoning else {}
            if text:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        else:
            logprobs = None if lps is None else completion_logprobs(lps, self.tokenizer, offsets, prompt,
                                                                    self.token_ids)
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}
        if reason is not None:
            choice["stop_reason"] = stop_reason
        return self._chunk([choice])

    def call(self, index: int, event: tuple) -> dict:
        """A piece of a chat choice's tool calls (tool_stream.py): call k opening, with its id and
        name, or more of its arguments."""
        kind, k, value = event
        call = dict(value, index=k) if kind == "open" else {"index": k, "function": {"arguments": value}}
        return self._chunk([{"index": index, "delta": {"tool_calls": [call]}, "logprobs": None,
                             "finish_reason": None}])

    def usage(self, job: Job, comps: list) -> dict:
        return self._chunk([], usage=usage(job, comps))

    @staticmethod
    def failure(err) -> dict:
        """The event of a choice that failed: the body of the ApiError `err` its request gets unstreamed."""
        return err.body

