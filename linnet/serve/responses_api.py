"""OpenAI's Responses API (POST /v1/responses) over chat completions.

A Responses body is read into the chat body it means (`chat_body`): its `input` items become
messages (an earlier `function_call` an assistant turn's tool call, a `function_call_output` a
tool message), `instructions` a system message first, its flat function tools chat's nested
ones, `text.format` chat's `response_format`, `max_output_tokens` max_tokens; the sampling
fields pass as they are. The chat job then runs, and its one choice is written back as a
Response (`response_object`): a reasoning model's thinking a `reasoning` item, the text an
assistant `message` item, each tool call a `function_call` item. Streamed, `ResponseWriter`
sends Responses' typed events in place of chat's chunks. A finished Response is kept (unless
its body says `store: false`; responses_store.py), and a body naming it as its
`previous_response_id` continues its conversation.
"""

from __future__ import annotations

import json
import time

from dataclasses import dataclass

from linnet.serve.openai_api import ApiError, Job, logprob_count, number_field, reasoning_effort
from linnet.serve.openai_replies import (calls_start, chat_logprobs, choice_stream, divide_reply, new_id, reply_text,
                                         usage)

# Responses' fields that pass to the chat body as they are (sampling, vLLM's extras included)
PASSED = ("model", "temperature", "top_p", "stream", "parallel_tool_calls", "seed", "top_k", "min_p",
          "presence_penalty", "frequency_penalty", "repetition_penalty", "stop", "logit_bias", "min_tokens",
          "ignore_eos", "stop_token_ids", "allowed_token_ids", "chat_template_kwargs", "skip_special_tokens",
          "include_stop_str_in_output", "truncate_prompt_tokens", "structured_outputs", "guided_json",
          "guided_regex", "guided_choice", "guided_grammar", "include_reasoning", "cache_salt")


@dataclass
class ResponsesCall:
    """A Responses body and the conversation it continues, as chat messages: its previous
    response's (that one's input and output) and its own input, its `instructions` apart (they do
    not carry over to a later response)."""

    body: dict
    conversation: list

    @property
    def stored(self) -> bool:
        return self.body.get("store", True)


def read_call(body: dict, store) -> ResponsesCall:
    """A Responses body with the conversation it continues (from `store`, a `ResponseStore`)."""
    if not isinstance(body.get("store", True), bool):
        raise ApiError(400, "'store' must be true or false", "store")
    previous = body.get("previous_response_id")
    earlier = [] if previous is None else store.conversation(previous)
    called = {call["id"] for m in earlier for call in m.get("tool_calls") or []}
    return ResponsesCall(body, earlier + _messages(body.get("input"), called=called))


def input_items(body: dict) -> list:
    """A body's input as OpenAI lists it back: items, a string as one user message, each with an id."""
    given = body.get("input")
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": given}]}] \
        if isinstance(given, str) else [dict(item) for item in given or [] if isinstance(item, dict)]
    for item in items:
        item.setdefault("type", "message")
        if not item.get("id"):
            item["id"] = new_id("msg" if item["type"] == "message" else "item", "_")
    return items


def conversation_after(call: ResponsesCall, output: list) -> list:
    """The conversation a later response continues from this one: its own, then its output's turn."""
    return call.conversation + _messages(output, output=True)


def chat_body(call: ResponsesCall) -> dict:
    """The chat completions body a Responses body asks for; a bad one is an `ApiError`."""
    body = call.body
    if body.get("background"):
        raise ApiError(400, "'background' is not supported", "background")
    if body.get("truncation") not in (None, "disabled"):
        raise ApiError(400, "'truncation' may only be 'disabled': a prompt too long for the context is refused",
                       "truncation")
    chat = {k: body[k] for k in PASSED if body.get(k) is not None}
    messages = [] if body.get("instructions") is None else [{"role": "system", "content": _text(
        body["instructions"], "instructions")}]
    chat["messages"] = messages + call.conversation
    if body.get("max_output_tokens") is not None:  # checked here, so that an error names it
        chat["max_tokens"] = number_field(body, "max_output_tokens", None, 1, None, integer=True)
    if body.get("tools"):
        chat["tools"] = [_tool(i, t) for i, t in enumerate(body["tools"] if isinstance(body["tools"], list)
                                                              else [None])]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"], [t["function"]["name"] for t in chat.get("tools", [])])
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise ApiError(400, "'text' must be an object, as {'format': {'type': 'text'}}", "text")
    fmt = (text or {}).get("format")
    if fmt is not None:
        chat["response_format"] = _response_format(fmt)
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise ApiError(400, "'reasoning' must be an object, as {'effort': 'high'}", "reasoning")
    effort = reasoning_effort((reasoning or {}).get("effort"), "reasoning.effort")
    if effort is not None:  # gpt-oss's template writes it into the system message
        chat["chat_template_kwargs"] = dict(chat.get("chat_template_kwargs") or {}, reasoning_effort=effort)
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise ApiError(400, "'include' must be a list of strings", "include")
    top = logprob_count(body, "top_logprobs")  # checked whether or not it is used
    # as OpenAI's (and vLLM's): logprobs come where `include` names them, top_logprobs alone gives none;
    # the other includes name outputs this server never makes: nothing to add
    if "message.output_text.logprobs" in include:
        chat["logprobs"] = True
        if top is not None:
            chat["top_logprobs"] = top
    return chat


def _text(value, where: str) -> str:
    """A string, or content parts' texts joined a line each, as chat's (input_text, output_text, text)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
                                       and isinstance(p.get("text"), str) for p in value):
        return "\n".join(p["text"] for p in value)
    raise ApiError(400, f"'{where}' must be a string or a list of text parts (input_text, output_text)", where)


def _messages(items, output: bool = False, called: set = frozenset()) -> list:
    """Chat messages for Responses' `input`: a string, or a list of message, function_call,
    function_call_output and reasoning items (a reasoning item's text the `reasoning_content` of
    the assistant turn after it, which templates such as gpt-oss's write back before its calls);
    with `output`, for a Response's own output items (which may be none). A function_call_output
    answers a call made before it: in these items, or among the ids `called` earlier."""
    if output and not items:
        return []
    if isinstance(items, str):
        if not items:
            raise ApiError(400, "'input' must not be empty", "input")
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ApiError(400, "'input' must be a string or a non-empty list of items", "input")
    messages, thought = [], None  # thought: a reasoning item's text, for the assistant turn after it
    called = set(called)
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and isinstance(item.get("role"), str):
            if item["role"] not in ("user", "assistant", "system", "developer"):  # (named here: chat's names messages[i])
                raise ApiError(400, f"'{where}.role' {item['role']!r} is not one of user, assistant, system, developer",
                               f"{where}.role")
            messages.append({"role": item["role"], "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call" and all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            try:
                json.loads(item["arguments"] or "{}")
            except ValueError as err:
                if output:  # the server's own call, cut short by max_output_tokens: never made, not continued
                    continue
                raise ApiError(400, f"'{where}.arguments' is not JSON: {err}", f"{where}.arguments") from None
            called.add(item["call_id"])
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and thought is None:
                last.setdefault("tool_calls", []).append(call)  # the turn's text and its calls: one turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output" and isinstance(item.get("call_id"), str):
            if item["call_id"] not in called:
                raise ApiError(400, f"'{where}' answers call_id {item['call_id']!r}, but no function_call with that "
                                    f"id comes before it", f"{where}.call_id")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":
            thought = _thought(item)
            continue
        else:
            raise ApiError(400, f"'{where}' must be a message {{'role', 'content'}}, a function_call {{'call_id', "
                                f"'name', 'arguments'}} or a function_call_output {{'call_id', 'output'}}", where)
        if thought is not None and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning_content"] = thought
        thought = None
    return messages


def _thought(item: dict) -> str | None:
    """A reasoning item's text: its content's, else its summary's (an encrypted one has none here)."""
    for key in ("content", "summary"):
        parts = item.get(key)
        texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)] \
            if isinstance(parts, list) else []
        if texts:
            return "".join(texts)
    return None


def _tool(i: int, tool) -> dict:
    """Responses' flat function tool as chat's nested one; other tool kinds (web search, files) are not here."""
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise ApiError(400, f"tools[{i}] must be {{'type': 'function', 'name': ..., 'parameters': {{...}}}}; "
                            f"this server runs no built-in tools", f"tools[{i}]")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _tool_choice(choice, names: list):
    """The Responses API's tool_choice in chat's form: a named function is {"type": "function", "name": ...}
    here, and is refused in that form where it names none of the tools (chat's message shows its own)."""
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name") in names:
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ApiError(400, "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...} naming "
                        "one of the tools", "tool_choice")


def _response_format(fmt) -> dict:
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        schema = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if isinstance(fmt, dict) and fmt.get("type") in ("text", "json_object"):
        return {"type": fmt["type"]}
    raise ApiError(400, "'text.format' must be {'type': 'text'}, {'type': 'json_object'} or {'type': "
                        "'json_schema', 'name': ..., 'schema': {...}}", "text.format")


# ---------------------------------------------------------------- output items


def reasoning_item(item_id: str, text: str) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "status": "completed"}


def message_item(item_id: str, text: str, logprobs: list = ()) -> dict:
    return {"type": "message", "id": item_id, "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": list(logprobs)}]}


# an item of text, by its type: what makes it, and its id's prefix
_TEXT_ITEMS = {"reasoning": (reasoning_item, "rs"), "message": (message_item, "msg")}


def call_item(item_id: str, call: dict, arguments: str | None = None) -> dict:
    fn = call["function"]
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": fn["name"],
            "arguments": fn["arguments"] if arguments is None else arguments, "status": "completed"}


def output_items(message: dict, logprobs: list = ()) -> list:
    """A chat message as Responses' output items: thinking, text (with its tokens' `logprobs`), tool
    calls, in that order."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_id("rs", "_"), message["reasoning_content"]))
    if message.get("content"):
        items.append(message_item(new_id("msg", "_"), message["content"], logprobs))
    items += [call_item(new_id("fc", "_"), call) for call in message.get("tool_calls") or []]
    return items


def answer_logprobs(job: Job, text: str, tokens: list, upto: int, ended: bool = False) -> tuple:
    """(the logprobs of the tokens that write a reply's answer, the tokens not yet placed) of
    `tokens`, [(where its text starts in the reply's `text`, chat logprobs entry)]: a token is
    placed once the reply is out past where it starts (`upto`), and writes the answer where the
    text there is answer (not thinking, not a marker) before any tool call. A token whose text is
    held back (part of a character) is placed by the character it completes; the end token, with
    no text, is no answer's. `ended`: `text` is the whole reply."""
    calls = calls_start(job, text, ended)
    placed = tokens[:sum(at < upto for at, _ in tokens)]  # starts only grow
    answer = [entry for at, entry in placed if (calls is None or at < calls) and divide_reply(job, text, at, at + 1)[1]]
    return answer, tokens[len(placed):]


def reply_logprobs(job: Job, comp, tokenizer) -> list:
    """The logprobs of a finished choice's answer tokens (none where none were asked for)."""
    if comp.request.logprobs is None:
        return []
    stream = choice_stream(job, comp, tokenizer)
    starts = stream.add(list(comp.tokens))
    stream.finish(reply_text(job, comp, tokenizer))
    entries = chat_logprobs(comp.logprobs, tokenizer, job.token_ids)["content"]
    return answer_logprobs(job, stream.text, list(zip(starts, entries)), len(stream.text), ended=True)[0]


def response_object(body: dict, job: Job, comps: list, model: str, output: list, finish: str | None,
                    response_id: str, created: int, tokenizer, status: str | None = None) -> dict:
    """The Response for a finished (or, with `status`, a starting) chat choice's output items."""
    if status is None:
        status = "incomplete" if finish == "length" else "completed"
    counts = usage(job, comps) if comps else None
    thinking = "".join(i["content"][0]["text"] for i in output if i["type"] == "reasoning" and i["content"])
    return {
        "id": response_id, "object": "response", "created_at": created, "status": status, "model": model,
        "output": output, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        # the sampling the request ran with (its body's, else the model's generation config's or 1), as
        # OpenAI's and vLLM's Response say it, not a null where the body left it out
        "temperature": job.requests[0].temperature, "top_p": job.requests[0].top_p,
        "top_logprobs": body.get("top_logprobs"),
        "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "text": body.get("text") or {"format": {"type": "text"}}, "reasoning": body.get("reasoning"),
        "metadata": body.get("metadata"), "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store", True), "truncation": "disabled",
        "usage": None if counts is None else {
            "input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": counts["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": counts["completion_tokens"],
            # the thinking's tokens, as its text encodes (where it ends is a text position, not a token's)
            "output_tokens_details": {"reasoning_tokens": len(tokenizer.encode(thinking, add_special_tokens=False))
                                      if thinking and tokenizer is not None else 0},
            "total_tokens": counts["total_tokens"]},
    }


class ResponseWriter:
    """The typed server-sent events of one streamed Response, in the calls `ChunkWriter` takes: an
    item opens on its first text, closes when another begins or the reply ends; the last event
    carries the whole Response, its items as streamed."""

    sse_events = True  # each event's type also goes on the stream's `event:` line

    def __init__(self, body: dict, job: Job, model: str, tokenizer):
        self.body, self.job, self.model, self.tokenizer = body, job, model, tokenizer
        self.id, self.created = new_id("resp", "_"), int(time.time())
        self.sequence = 0
        self.output: list = []  # finished items
        self.open: dict | None = None  # the item being written: {"item": ..., "text": ..., "logprobs": [...]}
        self.unplaced: list = []  # [(text start, logprobs entry)] of tokens not yet known to write the answer or not
        self.finish: str | None = None
        self.final: dict | None = None  # the whole Response, once the last event is written
        self.error: dict | None = None  # a failed Response's error: {code, message}

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _response(self, status: str | None = None, comps: list = ()) -> dict:
        return response_object(self.body, self.job, list(comps), self.model, list(self.output), self.finish,
                                self.id, self.created, self.tokenizer, status)

    def start(self, index: int) -> list:
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress"))]

    def _opened(self, kind: str) -> list:
        """Events closing the open item unless it is of `kind`, then opening one of `kind`."""
        if self.open is not None and self.open["item"]["type"] == kind:
            return []
        events = self._close()
        make, prefix = _TEXT_ITEMS[kind]
        empty = make(new_id(prefix, "_"), "")
        item = dict(empty, content=[], status="in_progress")
        self.open = {"item": item, "text": "", "logprobs": []}
        at = len(self.output)
        return events + [self._event("response.output_item.added", output_index=at, item=item),
                         self._event("response.content_part.added", item_id=item["id"], output_index=at,
                                     content_index=0, part=empty["content"][0])]

    def _close(self, status: str | None = None) -> list:
        if self.open is None:
            return []
        item, text, at = self.open["item"], self.open["text"], len(self.output)
        if status is None:
            status = "incomplete" if self.finish == "length" else "completed"  # the item max_output_tokens cut
        if item["type"] == "function_call":
            done = dict(item, arguments=text, status=status)
            self.output.append(done)
            self.open = None
            return [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                                arguments=text),
                    self._event("response.output_item.done", output_index=at, item=done)]
        logprobs = self.open["logprobs"]
        self.open = None
        if item["type"] == "reasoning":
            done = reasoning_item(item["id"], text)
            text_done = self._event("response.reasoning_text.done", item_id=item["id"], output_index=at,
                                    content_index=0, text=text)
        else:
            done = message_item(item["id"], text, logprobs)
            text_done = self._event("response.output_text.done", item_id=item["id"], output_index=at,
                                    content_index=0, text=text, logprobs=logprobs)
        done["status"] = status
        self.output.append(done)
        return [text_done,
                self._event("response.content_part.done", item_id=item["id"], output_index=at, content_index=0,
                            part=done["content"][0]),
                self._event("response.output_item.done", output_index=at, item=done)]

    def piece(self, index: int, text: str, lps: list | None = None, offsets: list | None = None,
              reason: str | None = None, prompt: tuple | None = None, reasoning: str = "",
              reply: tuple | None = None, stop_reason: int | str | None = None) -> list:
        """`reply`: (the reply's text so far, how much of it is out with this piece, whether it is
        whole), to place the tokens' logprobs: an answer's token's go with the text delta its text
        starts in. A Response has no stop_reason (ChunkWriter's signature)."""
        if lps:
            entries = chat_logprobs(lps, self.tokenizer, self.job.token_ids)["content"]
            self.unplaced += zip(offsets, entries)
        placed = []
        if reply is not None and self.unplaced:
            placed, self.unplaced = answer_logprobs(self.job, reply[0], self.unplaced, reply[1], ended=reply[2])
        events = []
        for kind, delta in (("reasoning", reasoning), ("message", text)):
            if not delta:
                continue
            events += self._opened(kind)
            self.open["text"] += delta
            name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
            extra = {} if kind == "reasoning" else {"logprobs": placed}
            if kind == "message":
                self.open["logprobs"] += placed
                placed = []
            events.append(self._event(name, item_id=self.open["item"]["id"], output_index=len(self.output),
                                      content_index=0, delta=delta, **extra))
        if placed and self.open is not None and self.open["item"]["type"] == "message":
            self.open["logprobs"] += placed  # this piece sends no answer text for them: they go on the item
        if reason is not None:
            self.finish = reason
            events += self._close()
        return events

    def call(self, index: int, event: tuple) -> list:
        """A piece of the tool calls (tool_stream.py): a function_call item opening (closing the item
        before it), or more of its arguments."""
        kind, _, value = event
        if kind == "open":
            events = self._close()
            item = call_item(new_id("fc", "_"), value)
            self.open = {"item": dict(item, status="in_progress"), "text": ""}
            return events + [self._event("response.output_item.added", output_index=len(self.output),
                                         item=self.open["item"])]
        self.open["text"] += value
        return [self._event("response.function_call_arguments.delta", item_id=self.open["item"]["id"],
                            output_index=len(self.output), delta=value)]

    def failure(self, err) -> list:
        """OpenAI's `error` event for the ApiError `err` a failed request gets unstreamed, after the item
        being written is closed as far as it got ("incomplete"): "response.failed" (`usage`), the last
        event, carries the items already sent, as OpenAI's does."""
        error = err.body["error"]
        # (a Response's error code is one of OpenAI's: the client's fault is its prompt's)
        self.error = {"code": "server_error" if err.status >= 500 else "invalid_prompt", "message": error["message"]}
        return self._close("incomplete") + [self._event("error", code=error["code"], message=error["message"],
                                                        param=error["param"])]

    def usage(self, job: Job, comps: list) -> dict:
        if self.error is not None:
            self.final = dict(self._response("failed", comps), error=self.error)
            return self._event("response.failed", response=self.final)
        # "response.completed" even for an incomplete response (its status says so), as vLLM sends it:
        # OpenAI's client's stream helper ends on no other event
        self.final = self._response(comps=comps)
        return self._event("response.completed", response=self.final)


def response(body: dict, job: Job, comps: list, model: str, message: dict, finish: str | None, tokenizer) -> dict:
    """The Response of a finished job: its one choice's chat message, as output items."""
    logprobs = reply_logprobs(job, comps[0], tokenizer)
    items = output_items(message, logprobs)
    if items and finish == "length":  # the item max_output_tokens cut, as OpenAI marks it
        items[-1]["status"] = "incomplete"
    return response_object(body, job, comps, model, items, finish, new_id("resp", "_"), int(time.time()), tokenizer)
