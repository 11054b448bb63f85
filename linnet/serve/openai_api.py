"""OpenAI's completions and chat completions: request bodies to engine `Request`s, results to responses.

Pure functions, no I/O: the server (server.py) does the HTTP. Every bad body
becomes an `ApiError` carrying the HTTP status and OpenAI's error object.
"""

from __future__ import annotations

import time
import uuid

from linnet.serve.request import Request, RequestError


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _number(body: dict, name: str, default, lo=None, hi=None, integer=False):
    value = body.get(name, default)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise ApiError(400, f"'{name}' must be {'an integer' if integer else 'a number'}, not {value!r}", name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ApiError(400, f"'{name}' must be between {lo} and {hi}, not {value}", name)
    return value


def _stops(body: dict) -> list:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise ApiError(400, "'stop' must be a string or a list of at most 4 non-empty strings", "stop")
    return stop


def sampling_request(body: dict, prompt: list, max_tokens_default: int) -> Request:
    """The engine request for a body's sampling fields (OpenAI's, plus vLLM's top_k, min_p, ...)."""
    if body.get("n", 1) != 1:
        raise ApiError(400, "only n=1 is supported", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _number({"max_tokens": max_tokens}, "max_tokens", max_tokens_default, 1, None, integer=True)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ApiError(400, f"'seed' must be an integer, not {seed!r}", "seed")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) for t in stop_ids):
        raise ApiError(400, "'stop_token_ids' must be a list of integers", "stop_token_ids")
    return Request(
        prompt=prompt, max_new_tokens=max_tokens,
        temperature=float(_number(body, "temperature", 1.0, 0, 2)),
        top_p=float(_number(body, "top_p", 1.0, 0, 1)) or 1e-6,
        top_k=int(_number(body, "top_k", 0, -1, None, integer=True)) if body.get("top_k", 0) != -1 else 0,
        min_p=float(_number(body, "min_p", 0.0, 0, 1)),
        presence_penalty=float(_number(body, "presence_penalty", 0.0, -2, 2)),
        frequency_penalty=float(_number(body, "frequency_penalty", 0.0, -2, 2)),
        repetition_penalty=float(_number(body, "repetition_penalty", 1.0, 0.01, 10)),
        seed=None if seed is None else seed & 0x7FFFFFFF, stop=_stops(body), stop_token_ids=stop_ids,
        ignore_eos=bool(body.get("ignore_eos", False)),
    )


def completion_request(body: dict, tokenizer, vocab: int) -> Request:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ApiError(400, "this model has no tokenizer: send the prompt as token ids", "prompt")
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = prompt
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError(400, "batched prompts are not supported: send one prompt per request", "prompt")
    else:
        raise ApiError(400, "'prompt' must be a non-empty string or a list of token ids", "prompt")
    if body.get("echo"):
        raise ApiError(400, "'echo' is not supported", "echo")
    req = sampling_request(body, ids, 16)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        req.logprobs = int(_number(body, "logprobs", 0, 0, 5, integer=True))
    return req


def chat_request(body: dict, tokenizer) -> Request:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", "messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a 'role'", f"messages[{i}]")
        if m["role"] not in ("system", "user", "assistant", "developer", "tool"):
            raise ApiError(400, f"messages[{i}].role {m['role']!r} is not one of system, user, assistant, tool",
                           f"messages[{i}].role")
        content = m.get("content", "")
        if isinstance(content, list):  # content parts: text only
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ApiError(400, f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string", f"messages[{i}].content")
        clean.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    if tokenizer is None or tokenizer.chat_template is None:
        raise ApiError(400, "this model has no chat template; use /v1/completions", "messages")
    try:
        text = tokenizer.apply_chat_template(clean, add_generation_prompt=True)
    except Exception as err:
        raise ApiError(400, f"the chat template rejected the messages: {err}", "messages") from None
    ids = tokenizer.encode(text, add_special_tokens=False)
    req = sampling_request(body, ids, 512)
    if body.get("logprobs"):
        req.logprobs = int(_number(body, "top_logprobs", 0, 0, 20, integer=True))
    return req


def check_fits(req: Request, vocab: int, max_seq: int, limit_tokens: bool = True) -> None:
    """A request that cannot fit a cache row is a 400, as OpenAI answers a too-long context."""
    if limit_tokens and len(req.prompt) + req.max_new_tokens > max_seq:
        room = max_seq - len(req.prompt)
        if room < 1:
            raise ApiError(400, f"the prompt is {len(req.prompt)} tokens; this server's context is {max_seq}",
                           "messages", "context_length_exceeded")
        raise ApiError(400, f"the prompt ({len(req.prompt)} tokens) plus max_tokens ({req.max_new_tokens}) exceeds "
                            f"the context of {max_seq} tokens; ask for at most {room}", "max_tokens",
                       "context_length_exceeded")
    try:
        req.validate(vocab, max_seq)
    except RequestError as err:
        raise ApiError(400, str(err).split(": ", 1)[-1], "prompt") from None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_logprobs(comp, tokenizer) -> dict | None:
    if comp.request.logprobs is None:
        return None
    text = (lambda t: tokenizer.decode([t])) if tokenizer else str
    return {"tokens": [text(lp.token) for lp in comp.logprobs],
            "token_logprobs": [lp.logprob for lp in comp.logprobs],
            "top_logprobs": [{text(t): v for t, v in lp.top} for lp in comp.logprobs],
            "text_offset": []}


def chat_logprobs(comp, tokenizer) -> dict | None:
    if comp.request.logprobs is None:
        return None
    text = (lambda t: tokenizer.decode([t])) if tokenizer else str
    entry = lambda t, v: {"token": text(t), "logprob": v, "bytes": list(text(t).encode())}
    return {"content": [dict(entry(lp.token, lp.logprob), top_logprobs=[entry(t, v) for t, v in lp.top])
                        for lp in comp.logprobs]}


def completion_response(comp, model: str, text: str, tokenizer) -> dict:
    return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": completion_logprobs(comp, tokenizer),
                         "finish_reason": finish_reason(comp)}],
            "usage": usage(len(comp.request.prompt), len(comp.tokens))}


def chat_response(comp, model: str, text: str, tokenizer) -> dict:
    return {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": chat_logprobs(comp, tokenizer), "finish_reason": finish_reason(comp)}],
            "usage": usage(len(comp.request.prompt), len(comp.tokens))}


def finish_reason(comp) -> str | None:
    return {"cancelled": "stop"}.get(comp.finish_reason, comp.finish_reason)
