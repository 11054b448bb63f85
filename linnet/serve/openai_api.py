"""OpenAI's completions and chat completions: request bodies to engine `Request`s.

Pure functions, no I/O: the server (server.py) does the HTTP, and openai_replies.py
writes the results back. Every bad body becomes an `ApiError` carrying the HTTP
status and OpenAI's error object.

One body may ask for several choices: `n` samples of each prompt, and on
/v1/completions a list of prompts. They become one `Job` of engine requests,
choice i being prompt i // n's copy i % n, as OpenAI and vLLM number them.
The copies of a prompt share it, so the engine prefills it once. Where the
prompt's own logprobs are asked for (echo with logprobs, or vLLM's
`prompt_logprobs`), copy 0 scores it and the others share its scores.
"""

from __future__ import annotations

import json
import math
import weakref
from dataclasses import dataclass

from linnet.nest.bounded_template import TemplateLimitError
from linnet.nest.chat_template import takes_content_parts, template_strings
from linnet.nest.errors import TokenizerError
from linnet.serve.request import MAX_LOGPROBS, SAMPLING_RANGES, Request, RequestError, is_int, tokens
from linnet.serve.structured import Structure
from linnet.serve.tool_parsers import FirstCall, call_ids, forced_calls, openai_call_id

MAX_CHOICES = 256  # choices one body may ask for: prompts x n
MAX_STOPS = 64
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat's is the rest of the context


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: tuple = ()):
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
        self.headers = headers  # (name, value) pairs of bytes the answer carries: a 405's Allow

    def names_param(self, old: str, new: str) -> None:
        """The error's param `new` where it is `old` (a field as the body that was sent calls it)."""
        if self.body["error"]["param"] == old:
            self.body["error"]["param"] = new


@dataclass
class Job:
    """What one body asks of the engine."""

    requests: list  # choice i's request
    prompt_tokens: int  # each prompt counted once, however many choices sample it
    echo: list | None = None  # with echo, the text to put before choice i's: completions' prompt, chat's last message
    include_usage: bool = False  # streamed: a last chunk with the usage
    n: int = 1  # choices per prompt: choice i's prompt is scored by choice i - i % n
    tool_call: str | None = None  # chat: "auto", "required", or the function tool_choice names
    tool_parser: object = None  # with a tool_call: the reader of its calls (the model's own format with "auto")
    tool_names: frozenset = frozenset()  # the functions the request offers
    call_id: object = openai_call_id  # makes a tool call's id, as the model's template takes them back
    reasoning: object = None  # chat: the reader of a reasoning model's thinking (reasoning.py), if the server has one
    echo_logprobs: bool = False  # echo with logprobs: the prompt's tokens lead each choice's logprobs
    echo_special: list | None = None  # whether choice i's echo holds its special tokens' text (their offsets' widths)
    prompt_logprobs: bool = False  # vLLM's prompt_logprobs: returned beside the choices
    token_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:ID"
    continuous_usage: bool = False  # streamed: every chunk its choice's usage so far (continuous_usage_stats)
    include_reasoning: bool = True  # vLLM's: false leaves a reasoning model's thinking out, whole and streamed

    def prompt_scores(self, comps: list, i: int) -> list:
        """Choice i's prompt logprobs, [None, TokenLogprob, ...], from the copy that scored them."""
        return comps[i - i % self.n].prompt_logprobs


def shown(value) -> str:
    """A value as an error message quotes it: as JSON, the client's own spelling (true, null, "x"),
    cut short where it is long."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # (what json did not read: a Python caller's own value)
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def number_field(body: dict, name: str, default, lo=None, hi=None, integer=False):
    """body[name] (default where absent or null), a finite number (an int with `integer`) in [lo, hi]."""
    value = body.get(name, default)
    if value is None:
        return default
    # (an int is finite, and math.isfinite cannot take one past a float's range)
    ok = isinstance(value, int) or not integer and isinstance(value, float) and math.isfinite(value)
    if isinstance(value, bool) or not ok:  # json reads NaN and Infinity: numbers that are not
        raise ApiError(400, f"'{name}' must be {'an integer' if integer else 'a number'}, not {shown(value)}", name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise ApiError(400, f"'{name}' must be {bounds}, not {shown(value)}", name)
    return value


def _sampling_field(body: dict, name: str, default):
    """body[name], a sampling field, in the range the engine takes (`SAMPLING_RANGES`)."""
    least, most, whole = SAMPLING_RANGES[name]
    return number_field(body, name, default, least, most, integer=whole)


def _boolean(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, not {shown(value)}", name)
    return value


def _stops(body: dict) -> list:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    # OpenAI takes at most 4; vLLM any number. Each is looked for in every new piece of text, so some bound.
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOPS:
        raise ApiError(400, f"'stop' must be a string or a list of at most {MAX_STOPS} non-empty strings", "stop")
    return stop


def _refuse_unsupported(body: dict, chat: bool) -> None:
    """Fields that would change the answer and that this server cannot honour: refused, never ignored."""
    _boolean(body, "stream", False)  # a stream or not: nothing else
    if chat:
        for legacy, now in (("functions", "tools"), ("function_call", "tool_choice")):  # OpenAI's deprecated pair
            if body.get(legacy):
                raise ApiError(400, f"'{legacy}' is not supported: send '{now}'", legacy)
        modalities = body.get("modalities")
        if modalities is not None and (not isinstance(modalities, list) or set(modalities) - {"text"}):
            raise ApiError(400, "this model answers in text only: 'modalities' may only be ['text']", "modalities")
        if body.get("audio") is not None:
            raise ApiError(400, "this model answers in text only: 'audio' is not supported", "audio")
    else:
        if body.get("suffix"):
            raise ApiError(400, "'suffix' is not supported", "suffix")
    if body.get("prompt_logprobs") is not None and body.get("stream"):
        raise ApiError(400, "'prompt_logprobs' is not supported with 'stream': true", "prompt_logprobs")
    user = body.get("user")  # (only its type: the end user's id is the client's to log)
    if user is not None and not isinstance(user, str):
        raise ApiError(400, f"'user' must be a string, not {shown(user)}", "user")
    _boolean(body, "spaces_between_special_tokens", True)  # vLLM's: a flag (special tokens' text is as decoded)
    # vLLM's fields this server does not honour
    for name, unset in (("use_beam_search", False), ("priority", 0), ("prompt_embeds", None),
                        ("logits_processors", None)):
        if body.get(name) not in (unset, None, [], ""):
            raise ApiError(400, f"'{name}' is not supported", name)


_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def _structure(body: dict) -> Structure | None:
    """What the body holds the output to: OpenAI's response_format, or vLLM's structured_outputs
    ({json | regex | choice | grammar | json_object}) and its older guided_* fields; one at most."""
    found = []
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_object":
            found.append(("response_format", Structure("json", {"type": "object"})))
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
                raise ApiError(400, "response_format.json_schema must be an object with a 'schema' object",
                               "response_format")
            found.append(("response_format", Structure("json", spec.get("schema") or {"type": "object"})))
        elif kind != "text":
            raise ApiError(400, "response_format.type must be 'text', 'json_object' or 'json_schema'", "response_format")
    outputs = body.get("structured_outputs")
    if outputs is not None:
        asked = {k: v for k, v in outputs.items() if v not in (None, False)} if isinstance(outputs, dict) else None
        if not asked or len(asked) != 1 or next(iter(asked)) not in ("json", "regex", "choice", "grammar", "json_object"):
            raise ApiError(400, "'structured_outputs' must hold one of json, regex, choice, grammar, json_object",
                           "structured_outputs")
        kind, spec = next(iter(asked.items()))
        found.append(("structured_outputs", Structure("json", {"type": "object"}) if kind == "json_object"
                      else Structure(kind, spec)))
    found += [(key, Structure(kind, body[key])) for key, kind in _GUIDED.items() if body.get(key) is not None]
    if len(found) > 1:
        raise ApiError(400, f"ask for one structure of the output, not '{found[0][0]}' and '{found[1][0]}'", found[1][0])
    return found[0][1] if found else None


def _tool_call(body: dict, parser) -> tuple:
    """(what tool_choice asks for: None, "auto", "required" or a function's name; the structure its
    call takes, if any). "none" shows the tools to the model through its chat template and calls
    none. A named function's call is its arguments, held to its parameters' schema; "required" is
    a JSON list of {name, parameters}, as vLLM's; but where `parser` reads a format whose calls
    have headers of their own (harmony's), a forced call is written in that format, held to it.
    "auto" (the default with tools) lets the model answer or call as it will, read by `parser`,
    the server's reader of its own tool-call format."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "'tool_choice' needs 'tools'", "tool_choice")
        return None, None
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list of function tools", "tools")
    functions = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("parameters", {}), dict):
            raise ApiError(400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                                f"'parameters': {{...}}}}}}", f"tools[{i}]")
        functions[fn["name"]] = fn.get("parameters") or {"type": "object", "properties": {}}
        _check_parameters(functions[fn["name"]], f"tools[{i}].function.parameters")
    if choice == "none":
        return None, None
    if choice in (None, "auto"):
        if parser is None:
            raise ApiError(400, "tool_choice 'auto' needs the server started with --tool-call-parser (the model's "
                                "own tool-call format); or send 'required', a named function, or 'none'",
                           "tool_choice")
        return "auto", None
    if choice == "required":
        forced, offered = "required", functions
    else:
        named = choice.get("function") if isinstance(choice, dict) else None
        forced = named.get("name") if isinstance(named, dict) else None
        if forced not in functions:
            raise ApiError(400, "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': "
                                "{'name': ...}} naming one of the tools", "tool_choice")
        offered = {forced: functions[forced]}
    for i, tool in enumerate(tools):  # a forced call is held to its schema: each must compile, named if not
        name = tool["function"]["name"]
        problem = Structure("json", functions[name]).problem() if name in offered else None
        if problem:
            raise ApiError(400, f"tools[{i}].function.parameters ({name!r}) cannot hold a call: {problem}",
                           f"tools[{i}].function.parameters")
    if hasattr(parser, "call_structure"):  # a format whose calls have headers of their own (harmony)
        return forced, parser.call_structure(offered)
    if forced != "required":
        return forced, Structure("json", functions[forced])
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
              "properties": {"name": {"const": name}, "parameters": params}} for name, params in functions.items()]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if body.get("parallel_tool_calls") is False:
        schema["maxItems"] = 1
    return "required", Structure("json", schema)


_SCHEMA_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


def _check_parameters(schema: dict, where: str) -> None:
    """A 400 naming the field where a function's parameters are no JSON schema of an object's
    fields in the shape every reader of them takes (Qwen3-Coder's parser types values by them):
    `type` one of JSON Schema's, `properties` an object of schemas, `required` a list of names."""
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    if not all(k in _SCHEMA_TYPES for k in kinds):
        raise ApiError(400, f"{where}.type must be one of {', '.join(_SCHEMA_TYPES)} (or a list of them), not "
                            f"{shown(kind)}", f"{where}.type")
    if kinds and "object" not in kinds:  # (an array's or a string's: a call of it had empty arguments, or none)
        raise ApiError(400, f"{where}.type must be \"object\": a function's arguments are an object's fields, as "
                            f"OpenAI's API takes them, not {shown(kind)}", f"{where}.type")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict) or not all(isinstance(v, (dict, bool)) for v in properties.values()):
        raise ApiError(400, f"{where}.properties must be an object of JSON schemas, not {shown(properties)}",
                       f"{where}.properties")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ApiError(400, f"{where}.required must be a list of property names, not {shown(required)}",
                       f"{where}.required")


def _choices_per_prompt(body: dict) -> int:
    n = number_field(body, "n", 1, 1, MAX_CHOICES, integer=True)
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise ApiError(400, "'best_of' is not supported (other than best_of = n)", "best_of")
    return n


def _reply_options(body: dict) -> dict:
    """What a body asks of the reply's form, as Job fields: a last chunk with the usage, vLLM's
    continuous_usage_stats (with it, the usage in every chunk), return_tokens_as_token_ids."""
    include, continuous = _stream_options(body)
    return {"include_usage": include, "continuous_usage": include and continuous,
            "token_ids": _boolean(body, "return_tokens_as_token_ids", False)}


def _stream_options(body: dict) -> tuple[bool, bool]:
    """stream_options' include_usage and continuous_usage_stats, each checked whatever the other
    says, and a bad one named by its path ('stream_options.include_usage'), as OpenAI names a field
    inside another."""
    options = body.get("stream_options")
    if options is None:
        return False, False
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", "stream_options")
    if not body.get("stream"):
        raise ApiError(400, "'stream_options' is only allowed with 'stream': true", "stream_options")
    flags = []
    for name in ("include_usage", "continuous_usage_stats"):
        value = options.get(name)
        if value is not None and not isinstance(value, bool):
            raise ApiError(400, f"'stream_options.{name}' must be true or false, not {shown(value)}",
                           f"stream_options.{name}")
        flags.append(bool(value))
    return flags[0], flags[1]


def _logit_bias(body: dict) -> dict | None:
    """OpenAI's logit_bias, {"token id": bias}, with integer keys."""
    bias = body.get("logit_bias")
    if not bias:
        return None
    if not isinstance(bias, dict):
        raise ApiError(400, "'logit_bias' must be an object mapping token ids to numbers", "logit_bias")
    out = {}
    for key, value in bias.items():  # the ids' range is checked with the request (check_fits)
        try:
            out[int(key)] = value
        except ValueError:
            raise ApiError(400, f"'logit_bias' keys must be token ids, not {shown(key)}", "logit_bias") from None
        # here, so that the message quotes the value as JSON has it (null, "x"), as the other fields' do
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and -100 <= value <= 100
        if not ok:  # (NaN fails the range; an int past a float's range compares as it is)
            raise ApiError(400, f"'logit_bias' values must be numbers between -100 and 100, not {shown(value)}",
                           "logit_bias")
    return out


def _bad_words(body: dict, tokenizer) -> list | None:
    """vLLM's bad_words: strings the output must not contain as words, each as the token ids it is
    written with at the text's start and after a space (" word": most tokenizers spell a word
    within a text with its space), for the engine to ban each one's last token after the rest."""
    words = body.get("bad_words")
    if not words:
        return None
    if not isinstance(words, list) or not all(isinstance(w, str) and w.strip() for w in words):
        raise ApiError(400, "'bad_words' must be a list of non-empty strings", "bad_words")
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer to spell 'bad_words' with", "bad_words")
    out = []
    for word in words:
        for spelling in (word.lstrip(), " " + word.lstrip()):
            ids = encode_text(tokenizer, spelling, "bad_words", add_special_tokens=False)
            if ids and ids not in out:
                out.append(ids)
    return out


def length_field(body: dict) -> str:
    """The field that limits a reply's length: max_completion_tokens is chat's new name for
    max_tokens; an explicit null falls back to the old one (as vLLM's)."""
    return "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"


def sampling_request(body: dict, prompt: list, max_seq: int, default_max_tokens: int | None,
                     fewest_tokens: int = 1, defaults: dict | None = None) -> Request:
    """The engine request for a body's sampling fields (OpenAI's, plus vLLM's top_k, min_p, ...).

    Without max_tokens a request may fill its row: `default_max_tokens` (None: no limit) cut to what
    the row has left; a max_tokens asked for is kept, and `check_fits` refuses it if it cannot fit.
    `fewest_tokens`: the least max_tokens may be (0 where an echo alone is an answer). `defaults`:
    the model's generation config's fields (`Tokenizer.sampling_defaults`), taken where the body
    sets none, before OpenAI's own defaults, as vLLM takes them."""
    if defaults:
        given = dict(defaults)
        cap = int(given.pop("max_tokens", 0))  # a cap on the default length, not a field the body sets
        if cap:
            default_max_tokens = cap if default_max_tokens is None else min(default_max_tokens, cap)
        body = {**given, **{k: v for k, v in body.items() if v is not None}}
    name = length_field(body)
    max_tokens = body.get(name)
    if max_tokens is None:
        room = max(1, max_seq - len(prompt))
        max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
    else:
        max_tokens = number_field(body, name, None, fewest_tokens, None, integer=True)
    seed = number_field(body, "seed", None, -(1 << 63), (1 << 63) - 1, integer=True)  # vLLM's: an int64
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(is_int(t) for t in stop_ids):
        raise ApiError(400, "'stop_token_ids' must be a list of integers", "stop_token_ids")
    allowed = body.get("allowed_token_ids")
    if allowed is not None and (not isinstance(allowed, list) or not allowed or not all(is_int(t) for t in allowed)):
        raise ApiError(400, "'allowed_token_ids' must be a non-empty list of token ids", "allowed_token_ids")
    return Request(
        prompt=prompt, max_new_tokens=max_tokens, structure=_structure(body),
        temperature=float(_sampling_field(body, "temperature", 1.0)),
        top_p=float(_sampling_field(body, "top_p", 1.0)),  # 0 keeps the likeliest token, as OpenAI takes it
        top_k=max(0, _sampling_field(body, "top_k", 0)),  # -1 and 0: no limit (vLLM's)
        min_p=float(_sampling_field(body, "min_p", 0.0)),
        presence_penalty=float(_sampling_field(body, "presence_penalty", 0.0)),
        frequency_penalty=float(_sampling_field(body, "frequency_penalty", 0.0)),
        repetition_penalty=float(_sampling_field(body, "repetition_penalty", 1.0)),
        seed=seed, stop=_stops(body), stop_token_ids=stop_ids,
        ignore_eos=_boolean(body, "ignore_eos", False), logit_bias=_logit_bias(body),
        min_tokens=int(number_field(body, "min_tokens", 0, 0, max_tokens, integer=True)), allowed_token_ids=allowed,
        include_stop=_boolean(body, "include_stop_str_in_output", False),
        skip_special_tokens=_boolean(body, "skip_special_tokens", True), cache_salt=_cache_salt(body),
    )


def _cache_salt(body: dict) -> str | None:
    """vLLM's cache_salt: requests share cached prompt tokens only with requests of the same salt."""
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ApiError(400, f"'cache_salt' must be a non-empty string if given, not {shown(salt)}", "cache_salt")
    return salt


def _copies(body: dict, prompt: list, max_seq: int, default_max_tokens: int | None, n: int,
            logprobs: int | None, prompt_logprobs: int | None = None, fewest_tokens: int = 1,
            tokenizer=None) -> list:
    """n requests sampling one prompt; with a seed, copy j draws with seed + j (as vLLM's do). Copy 0
    alone scores the prompt, when asked: a scoring request reuses no cached prompt, the others can.
    The tokenizer's `sampling_defaults` fill the fields the body leaves out."""
    out = []
    defaults = getattr(tokenizer, "sampling_defaults", None)
    bad_words = _bad_words(body, tokenizer)
    for j in range(n):
        req = sampling_request(body, prompt, max_seq, default_max_tokens, fewest_tokens, defaults)
        req.bad_words = bad_words
        if req.seed is not None:
            req.seed += j
        req.logprobs = logprobs
        req.prompt_logprobs = prompt_logprobs if j == 0 else None
        out.append(req)
    return out


def logprob_count(body: dict, name: str) -> int | None:
    """How many alternatives a logprobs field (completions' logprobs, vLLM's prompt_logprobs,
    Responses' top_logprobs) asks for with each token; None where it is not given."""
    if body.get(name) is None:
        return None
    return number_field(body, name, 0, 0, MAX_LOGPROBS, integer=True)


def encode_text(tokenizer, text: str, param: str, add_special_tokens: bool = True, what: str = "",
                most: int | None = None) -> list:
    """The ids of a body's text; text the tokenizer cannot take (a lone surrogate, which JSON's \\u
    escapes can write) is the client's error, at `param`. `what`: the text, where it is not the field's.
    `most`: the most tokens it may be (a prompt's, the context): a text too long for them to hold
    whatever its tokens, by `longest_token`, is refused before it is encoded. A 4 MB prompt is
    seconds of a thread's work to count; eight at once held every other request for a minute."""
    longest = longest_token(tokenizer) if most is not None else None
    if longest and len(text) > most * longest:  # (each token stands for at most `longest` characters)
        raise ApiError(400, f"the prompt is at least {tokens(-(-len(text) // longest))}; this server's context "
                            f"is {most}", param, "context_length_exceeded")
    try:
        return tokenizer.encode(text, add_special_tokens)
    except TokenizerError as err:
        raise ApiError(400, f"{what or repr(param)}: {err}", param) from None


_LONGEST: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# the tokenizers' normalizers and pre-tokenizers that never drop nor shorten text (a Replace, if its
# content is no shorter than its string, is checked on its own)
_KEEPING_NORMALIZERS = {"Prepend", "Replace"}
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation", "UnicodeScripts"}


def longest_token(tokenizer) -> int | None:
    """The most characters of a text one token of `tokenizer` can stand for (its vocabulary's
    longest piece, in UTF-8 bytes, which a piece's text never has fewer of), so that a text of C
    characters is at least C / it tokens; None where no such bound holds: where a run of text of
    any length may become one token (unknown characters fused into one <unk>, an added token that
    takes the spaces beside it) or none (a normalizer or pre-tokenizer that drops or shortens
    text), or where the tokenizer is not a `tokenizers` one. Found once a tokenizer."""
    if tokenizer in _LONGEST:
        return _LONGEST[tokenizer]
    backend = getattr(tokenizer, "backend", None)
    longest = None
    try:
        model = backend.model
        steps = [None if step is None else json.loads(step.__getstate__())
                 for step in (backend.normalizer, backend.pre_tokenizer)]
        # every character some token's: as bytes (byte-level, byte fallback), or each unknown one its own <unk>
        byte_level = '"ByteLevel"' in json.dumps(steps[1])
        unknown_bounded = getattr(model, "byte_fallback", False) or type(model).__name__ == "BPE" and (
            byte_level or model.unk_token is not None and not model.fuse_unk)
        kept = _keeps_text(steps[0], "normalizers", _KEEPING_NORMALIZERS) and \
            _keeps_text(steps[1], "pretokenizers", _KEEPING_PRE_TOKENIZERS)
        stripping = any(t.lstrip or t.rstrip for t in backend.get_added_tokens_decoder().values())
        if unknown_bounded and kept and not stripping:
            longest = max(len(piece.encode("utf-8", "surrogatepass"))
                          for piece in backend.get_vocab(with_added_tokens=True))
    except Exception:  # (not a `tokenizers` backend: a test's own, say) no bound, every text encoded
        longest = None
    try:
        _LONGEST[tokenizer] = longest
    except TypeError:  # (an object no weak reference can name: found again each time)
        pass
    return longest


def _keeps_text(step, many: str, keeping: set) -> bool:
    """Whether a normalizer or pre-tokenizer (`step`, its JSON; `many`: a Sequence's list of them)
    keeps every character of a text, none dropped and none made fewer."""
    if step is None:
        return True
    if step.get("type") == "Sequence":
        return all(_keeps_text(s, many, keeping) for s in step.get(many) or [])
    if step.get("type") not in keeping or step.get("behavior") == "Removed":
        return False
    if step["type"] == "Replace":
        pattern = step.get("pattern") or {}
        return isinstance(pattern.get("String"), str) and len(step.get("content", "")) >= len(pattern["String"])
    return True


def _prompts(body: dict, tokenizer, most: int | None = None) -> tuple[list, list]:
    """The body's prompts as token ids, and as given (text, or None where ids were sent); `most`:
    as `encode_text`'s."""
    prompt = body.get("prompt")
    is_ids = lambda p: isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
    if isinstance(prompt, str) or is_ids(prompt):
        prompt = [prompt]
    elif not (isinstance(prompt, list) and prompt and all(isinstance(p, str) or is_ids(p) for p in prompt)):
        raise ApiError(400, "'prompt' must be a non-empty string, a list of token ids, or a list of either",
                       "prompt")
    ids, texts = [], []
    for p in prompt:
        if isinstance(p, str):
            if tokenizer is None:
                raise ApiError(400, "this model has no tokenizer: send the prompt as token ids", "prompt")
            if not p:
                raise ApiError(400, "'prompt' must not be empty", "prompt")
            ids.append(encode_text(tokenizer, p, "prompt", most=most))
            texts.append(p)
        else:
            ids.append(p)
            texts.append(None)
    return ids, texts


def _truncated(body: dict, ids: list, max_seq: int) -> list:
    """vLLM's truncate_prompt_tokens: the prompt's last k tokens (all of it when shorter; -1: as
    many as a row holds)."""
    if body.get("truncate_prompt_tokens") is None:
        return ids
    k = number_field(body, "truncate_prompt_tokens", None, -1, max_seq, integer=True)
    if k == 0:
        raise ApiError(400, "'truncate_prompt_tokens' must be -1 or at least 1", "truncate_prompt_tokens")
    return ids[-(max_seq if k == -1 else k):]


def completion_job(body: dict, tokenizer, max_seq: int) -> Job:
    _refuse_unsupported(body, chat=False)
    n = _choices_per_prompt(body)
    # a text too long for a row is refused unencoded, unless its tail is what is asked for
    prompts, texts = _prompts(body, tokenizer, max_seq if body.get("truncate_prompt_tokens") is None else None)
    if body.get("truncate_prompt_tokens") is not None:  # what is echoed is what the model saw
        prompts = [_truncated(body, ids, max_seq) for ids in prompts]
        texts = [None] * len(prompts)
    if len(prompts) * n > MAX_CHOICES:
        raise ApiError(400, f"{len(prompts)} prompts x n = {n} is {len(prompts) * n} choices; at most "
                            f"{MAX_CHOICES} per request", "n")
    logprobs = logprob_count(body, "logprobs")
    echoed = _boolean(body, "echo", False)
    asked = logprob_count(body, "prompt_logprobs")
    # Echo with logprobs gives the prompt's tokens their logprobs, as OpenAI's legacy API did.
    wanted = [k for k in (asked, logprobs if echoed else None) if k is not None]
    requests = []
    for ids in prompts:
        requests += _copies(body, ids, max_seq, COMPLETION_MAX_TOKENS, n, logprobs, max(wanted, default=None),
                            fewest_tokens=0 if echoed else 1, tokenizer=tokenizer)
    echo, echo_special = None, None
    if echoed:
        # a text prompt is echoed as written, special tokens' text and all; ids as the request decodes its own
        skip = requests[0].skip_special_tokens
        shown = [t if t is not None else (tokenizer.decode(ids, skip_special_tokens=skip) if tokenizer else "")
                 for ids, t in zip(prompts, texts)]
        echo = [text for text in shown for _ in range(n)]
        echo_special = [t is not None or not skip for t in texts for _ in range(n)]
    return Job(requests, sum(len(p) for p in prompts), echo, n=n, **_reply_options(body),
               echo_logprobs=echoed and logprobs is not None, prompt_logprobs=asked is not None,
               echo_special=echo_special)


OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool")


def _message(i: int, m, roles: frozenset | None = None, parts: bool = False) -> dict:
    """One chat message as the template sees it: text content (parts joined, or kept as text parts
    where `parts`: the template loops over them, and a tool's joined, as vLLM passes them), developer
    as system.
    A role past OpenAI's goes to the template as it is where `roles` (None: any) holds it: the
    strings the template names, so Llama 3's `ipython` reaches Llama 3's template, as vLLM's custom
    roles and llama.cpp's server pass it, while a role no template knows is the client's error."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
        raise ApiError(400, f"messages[{i}] must be an object with a 'role'", f"messages[{i}]")
    if m["role"] not in OPENAI_ROLES and roles is not None and m["role"] not in roles:
        raise ApiError(400, f"messages[{i}].role {m['role']!r} is not one of {', '.join(OPENAI_ROLES)}, nor a role "
                            f"this model's chat template names", f"messages[{i}].role")
    content = m.get("content")
    if content is None and m["role"] != "assistant":  # only an assistant's turn may be calls alone
        raise ApiError(400, f"messages[{i}].content is required in a {m['role']} message", f"messages[{i}].content")
    if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
        given = "" if m.get("tool_call_id") is None else f", a string, not {shown(m['tool_call_id'])}"
        raise ApiError(400, f"messages[{i}].tool_call_id is required in a tool message: the id of the call it "
                            f"answers{given}", f"messages[{i}].tool_call_id")
    if content is None:
        content = ""
    if isinstance(content, list):  # content parts: text only, a line each (as vLLM and llama.cpp's server join them)
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ApiError(400, f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
            if not isinstance(part.get("text"), str):  # a text part, its text missing or of another type
                raise ApiError(400, f"messages[{i}].content[{j}].text must be a string, not {shown(part.get('text'))}",
                               f"messages[{i}].content[{j}].text")
            texts.append(part["text"])
        content = [{"type": "text", "text": t} for t in texts] if parts and m["role"] != "tool" else "\n".join(texts)
    if not isinstance(content, (str, list)):
        raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts",
                       f"messages[{i}].content")
    out = {"role": "system" if m["role"] == "developer" else m["role"], "content": content}
    for key in ("name", "tool_calls", "tool_call_id", "reasoning_content", "thinking"):  # what templates read
        if m.get(key) is not None:
            out[key] = m[key]
    if m.get("reasoning") is not None and "reasoning_content" not in out:  # vLLM's newer name for it
        out["reasoning_content"] = m["reasoning"]
    if out.get("tool_calls") == []:  # no calls: the turn is the template's plain kind (as vLLM drops them)
        del out["tool_calls"]
    # an earlier turn's thinking under both names: vLLM's, and gpt-oss's template's (which refuses
    # thinking beside the text of a turn that calls tools: it writes that text as the thinking)
    if "thinking" in out and "reasoning_content" not in out:
        out["reasoning_content"] = out["thinking"]
    if "reasoning_content" in out and "thinking" not in out and not (out["content"] and out.get("tool_calls")):
        out["thinking"] = out["reasoning_content"]
    if "tool_calls" in out:
        out["tool_calls"] = _earlier_calls(f"messages[{i}].tool_calls", out["tool_calls"])
    return out


def _earlier_calls(where: str, calls) -> list:
    """An earlier turn's tool calls as chat templates read them: each call's arguments an object.
    OpenAI's clients send them as JSON text; Llama's, Qwen's and Mistral's templates write them back
    with `tojson`, which would quote that text (transformers documents them as a dict; vLLM parses
    them so, too)."""
    if not isinstance(calls, list):
        raise ApiError(400, f"'{where}' must be a list", where)
    read = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(400, f"'{where}[{j}]' must be {{'id': ..., 'type': 'function', 'function': "
                                f"{{'name': ..., 'arguments': ...}}}}", f"{where}[{j}]")
        arguments = fn.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError as err:
                raise ApiError(400, f"'{where}[{j}].function.arguments' is not JSON: {err}",
                               f"{where}[{j}].function.arguments") from None
        read.append(dict(call, function=dict(fn, arguments=arguments)))
    return read


REASONING_EFFORTS = ("minimal", "low", "medium", "high")


def reasoning_effort(value, param: str):
    """A reasoning effort as a template reads it (chat's reasoning_effort, Responses' reasoning.effort);
    None where none is given; a 400 naming `param` for another word."""
    if value is not None and value not in REASONING_EFFORTS:
        raise ApiError(400, f"'{param}' must be one of {', '.join(map(repr, REASONING_EFFORTS))}, not {shown(value)}",
                       param)
    return value


def chat_prompt(body: dict, tokenizer, own_templates=None, most: int | None = None) -> list:
    """The token ids of the chat template applied to the body's messages (and tools, if shown).
    `own_templates`: where a request's own `chat_template` renders (a `TemplateSandbox`, bounded in
    time and memory), given where the server trusts requests to send one; `most`: as `encode_text`'s."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", "messages")
    template = body.get("chat_template")  # vLLM's: the request's own
    if template is not None and (not isinstance(template, str) or not template.strip()):
        raise ApiError(400, "'chat_template' must be a Jinja template, as a string", "chat_template")
    if template is not None and own_templates is None:
        raise ApiError(400, "a request's own 'chat_template' needs the server started with "
                            "--trust-request-chat-template; this one uses the model's", "chat_template")
    if tokenizer is None:  # (the text prompts /v1/completions would take are refused too: token ids only)
        raise ApiError(400, "this model has no tokenizer, which a chat's messages need; send the prompt as token ids "
                            "to /v1/completions", "messages")
    if tokenizer.chat_template is None and template is None:
        raise ApiError(400, "this model has no chat template; use /v1/completions", "messages")
    # the roles past OpenAI's a template takes: those the model's names; any, to a client's own
    models = (tokenizer.chat_template, *getattr(tokenizer, "chat_templates", {}).values())
    roles = None if template is not None else frozenset().union(*(template_strings(t) for t in models))
    parts = any(takes_content_parts(t) for t in ((template,) if template is not None else models) if t)
    clean = [_message(i, m, roles, parts) for i, m in enumerate(messages)]
    # vLLM's chat_template_kwargs: more variables for the template (Qwen3's enable_thinking, ...)
    extra = body.get("chat_template_kwargs") or {}
    if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
        raise ApiError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs")
    extra = {k: v for k, v in extra.items() if k not in ("messages", "add_generation_prompt", "template")}
    # OpenAI's reasoning_effort, a variable of the templates that read it (gpt-oss's writes it in its
    # system message), as vLLM hands it over; chat_template_kwargs' own wins
    effort = reasoning_effort(body.get("reasoning_effort"), "reasoning_effort")
    if effort is not None:
        extra.setdefault("reasoning_effort", effort)
    if body.get("tools"):
        extra["tools"] = body["tools"]
    documents = body.get("documents")  # vLLM's and transformers': for the templates of retrieval models
    if documents is not None:
        if not isinstance(documents, list) or not all(isinstance(d, dict) for d in documents):
            raise ApiError(400, "'documents' must be a list of objects (each {'title': ..., 'text': ...}, say)",
                           "documents")
        extra["documents"] = documents
    # vLLM's continue_final_message: the prompt ends inside the last (assistant) message, not after it
    extend = _boolean(body, "continue_final_message", False)
    generation_prompt = _boolean(body, "add_generation_prompt", not extend)
    if extend and generation_prompt:
        raise ApiError(400, "'continue_final_message' continues a final assistant message, and cannot be "
                            "sent with 'add_generation_prompt': true", "continue_final_message")
    if extend and clean[-1]["role"] != "assistant":
        raise ApiError(400, f"'continue_final_message' continues a final assistant message; the last message "
                            f"here is a {clean[-1]['role']} message", "continue_final_message")
    if extend:
        clean[-1], final = _tagged_final(clean[-1])
    try:
        if template is None:
            text = tokenizer.apply_chat_template(clean, add_generation_prompt=generation_prompt, **extra)
        else:
            text = own_templates.render(template, clean, add_generation_prompt=generation_prompt,
                                        special_tokens=tokenizer.special_tokens, **extra)
    except TemplateLimitError as err:
        raise ApiError(400, f"the request's 'chat_template' was stopped: {err}", "chat_template") from None
    except TokenizerError as err:
        if template is not None:
            raise ApiError(400, f"the request's 'chat_template' failed: {err}", "chat_template") from None
        raise ApiError(400, f"the chat template rejected the messages: {err}", "messages") from None
    except Exception as err:
        if template is not None:  # the sandbox's own failure (a worker that could not start): not the client's
            raise ApiError(500, f"the request's 'chat_template' could not be rendered: {err}",
                           kind="server_error") from None
        raise ApiError(400, f"the chat template rejected the messages: {err}", "messages") from None
    if extend:
        text = _cut_at_tag(text, final)
    return encode_text(tokenizer, text, "messages", add_special_tokens=False,
                       what="the chat template's text of 'messages'", most=most)


# transformers' mark at the end of the final message's text, where a prompt that continues it is cut
FINAL_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _tagged_final(message: dict) -> tuple[dict, str]:
    """(the final message with FINAL_TAG after its text, that text; of a message in parts, its last text part's),
    as transformers' continue_final_message marks it: the prompt is cut where the template put the mark, not
    where the text is last found, which the template's marks after it may hold too (an "e" in <|eot_id|>)."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": content + FINAL_TAG}, content
    parts = list(content or [])
    at = next((i for i in reversed(range(len(parts))) if isinstance(parts[i], dict) and "text" in parts[i]), None)
    if at is None:
        raise ApiError(400, "'continue_final_message': the final message has no text to continue",
                       "continue_final_message")
    text = parts[at]["text"]
    parts[at] = {**parts[at], "text": text + FINAL_TAG}
    return {**message, "content": parts}, text


def _cut_at_tag(text: str, final: str) -> str:
    """The rendered chat cut where the `final` message's text ends (at FINAL_TAG), as transformers cuts it:
    the template's end-of-turn marks after it go; the text's trailing spaces stay if the template kept them."""
    at = text.rfind(FINAL_TAG.strip())
    if at < 0 or final.strip() not in text:
        raise ApiError(400, "'continue_final_message': the chat template does not keep the final message's "
                            "text as it is", "continue_final_message")
    return text[:at] if text.startswith(FINAL_TAG, at) else text[:at].rstrip()


def chat_job(body: dict, tokenizer, max_seq: int, tool_parser=None, reasoning=None,
             structure_in_reasoning: bool = False, own_templates=None) -> Job:
    """`structure_in_reasoning`: a structure holds a reasoning model's thinking too (vLLM's
    structured_outputs_config.enable_in_reasoning), not just its answer; `own_templates`: as
    `chat_prompt`'s."""
    _refuse_unsupported(body, chat=True)
    n = _choices_per_prompt(body)
    most = max_seq if body.get("truncate_prompt_tokens") is None else None  # (as completions')
    ids = _truncated(body, chat_prompt(body, tokenizer, own_templates, most), max_seq)
    wants_logprobs = _boolean(body, "logprobs", False)  # chat's is a flag; completions' a count
    if body.get("top_logprobs") is not None and not wants_logprobs:
        raise ApiError(400, "when using 'top_logprobs', 'logprobs' must be set to true", "top_logprobs")
    logprobs = number_field(body, "top_logprobs", 0, 0, MAX_LOGPROBS, integer=True) if wants_logprobs else None
    asked = logprob_count(body, "prompt_logprobs")
    tool_call, structure = _tool_call(body, tool_parser)
    requests = _copies(body, ids, max_seq, None, n, logprobs, asked, tokenizer=tokenizer)
    prompt = None if reasoning is None or tokenizer is None else tokenizer.decode(ids)
    if prompt is not None:
        reasoning = reasoning.for_prompt(prompt)
    if reasoning is not None and reasoning.keeps_special:
        for r in requests:  # harmony's markers are special tokens: the engine's text, cut at a stop string, keeps them
            r.skip_special_tokens, r.keeps_end_token = False, True
    if structure is not None:
        if any(r.structure is not None for r in requests):
            raise ApiError(400, "a tool call's output is its arguments: send no other structure with it", "tool_choice")
        for r in requests:
            r.structure = structure
    if reasoning is not None and requests[0].structure is not None and prompt is not None \
            and not structure_in_reasoning \
            and not (structure is not None and reasoning.reads_whole_reply):  # harmony's call: thinking and all
        # A reasoning model thinks freely first: the structure holds its answer (as vLLM's reasoning-aware outputs).
        marker = reasoning.structure_after(prompt)
        for r in requests:
            r.structure_after = None if marker is None else tokenizer.encode(marker, add_special_tokens=False)
    call_id = call_ids(tool_parser)  # the model's template's form of ids, however the call is read
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in body.get("tools") or []}
    if tool_call is not None and tool_call != "auto" and not hasattr(tool_parser, "call_structure"):
        tool_parser = forced_calls(tool_call)  # a call forced as vLLM forms it; harmony's keeps its own format
    elif hasattr(tool_parser, "for_tools"):  # a format whose values the schemas type (Qwen3-Coder's)
        tool_parser = tool_parser.for_tools(schemas)
    if not _boolean(body, "parallel_tool_calls", True) and tool_call is not None:
        tool_parser = FirstCall(tool_parser)  # "auto": a model may write several calls; the first is kept
    echo = _chat_echo(body)
    return Job(requests, len(ids), [echo] * n if echo else None, n=n, **_reply_options(body),
               prompt_logprobs=asked is not None, tool_call=tool_call, reasoning=reasoning,
               tool_parser=tool_parser if tool_call else None, call_id=call_id, tool_names=frozenset(schemas),
               include_reasoning=_boolean(body, "include_reasoning", True))


def _chat_echo(body: dict) -> str:
    """vLLM's `echo` for chat: each reply's content starts with the last message's, where that is the
    assistant's own (the turn the reply continues); nothing to put before it otherwise."""
    if not _boolean(body, "echo", False):
        return ""
    last = _message(len(body["messages"]) - 1, body["messages"][-1])
    return last["content"] if last["role"] == "assistant" else ""


def check_fits(req: Request, vocab: int, max_seq: int, chat: bool = True, length: str = "max_tokens") -> None:
    """A request that cannot fit a cache row is a 400, as OpenAI answers a too-long context; the
    prompt's field is chat's `messages` or completions' `prompt`, the length's `length` (the
    body's own name for it: `length_field`, or the Responses API's max_output_tokens)."""
    if len(req.prompt) + req.max_new_tokens > max_seq:
        room = max_seq - len(req.prompt)
        if room < 1:
            raise ApiError(400, f"the prompt is {tokens(len(req.prompt))}; this server's context is {max_seq}",
                           "messages" if chat else "prompt", "context_length_exceeded")
        raise ApiError(400, f"the prompt ({tokens(len(req.prompt))}) plus {length} ({req.max_new_tokens}) exceeds "
                            f"the context of {max_seq} tokens; ask for at most {room}", length,
                       "context_length_exceeded")
    try:
        req.validate(vocab, max_seq)
    except RequestError as err:
        raise refused(err, req, body_fields(chat, length)) from None


def check_logprobs(req: Request, most: int, chat: bool = True) -> None:
    """A request for more logprobs a token than the server gives (vLLM's --max-logprobs) is a 400,
    with vLLM's words and the body's name for the field."""
    for field, kind in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
        asked = getattr(req, field)
        if asked is not None and asked > most:
            raise ApiError(400, f"Requested {kind} logprobs of {asked}, which is greater than max allowed: {most}",
                           body_fields(chat, "max_tokens").get(field, field))


def body_fields(chat: bool, length: str, body: dict | None = None) -> dict:
    """A body's names for the `Request` fields it sets, where they differ (RequestError.field): its
    prompt's, its length's, its logprobs', and the field its structure came from."""
    fields = {"prompt": "messages" if chat else "prompt", "max_new_tokens": length,
              "logprobs": "top_logprobs" if chat else "logprobs"}
    if body is not None:
        fields["structure"] = next((k for k in ("response_format", "structured_outputs", *_GUIDED)
                                    if body.get(k) is not None), "tool_choice")  # else a forced call's
    return fields


def refused(err: RequestError, req: Request, fields: dict) -> ApiError:
    """The engine's refusal of a request as the 400 for its body: the message without the engine's
    request id, the param the body's name for the field at fault (`body_fields`)."""
    return ApiError(400, str(err).removeprefix(f"{req.id}: "), fields.get(err.field, err.field))


