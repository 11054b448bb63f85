"""The OpenAI-compatible HTTP server: `linnet serve CARD --batch 32 --max-seq 4096 --port 8000`.

A plain ASGI application (run by uvicorn) over one `Engine` stepping on its
own thread. Routes: POST /v1/completions and /v1/chat/completions (with
"stream": true as server-sent events), POST /v1/responses (OpenAI's Responses API, run as the
chat it means: responses_api.py; GET and DELETE /v1/responses/ID and GET .../input_items, the
ones kept), GET /v1/models[/ID]; vLLM's POST /tokenize and /detokenize, GET /ping and
/version; GET /health and /metrics (Prometheus).
A bad request gets OpenAI's error object with its status; it never stops the
engine or the other requests. A client that disconnects cancels its requests.
Web pages on other origins may call it as `cors.CorsPolicy` allows.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from linnet.nest.template_sandbox import TemplateSandbox
from linnet.serve.cors import CorsPolicy
from linnet.serve.engine import Engine
from linnet.serve.metrics import prometheus_text
from linnet.serve.openai_api import (ApiError, Job, _boolean, body_fields, chat_job, chat_prompt, check_fits,
                                     check_logprobs, completion_job, encode_text, length_field, refused, shown)
from linnet.serve.choice_stream import ChoiceDeltas
from linnet.serve.openai_replies import (ChunkWriter, chat_message, chat_response, choice_usage, completion_response,
                                         echoed_prompt, marker_ids)
from linnet.serve.request import MAX_LOGPROBS, RequestError, is_int
from linnet.serve.responses_api import (ResponseWriter, ResponsesCall, chat_body, conversation_after, input_items,
                                        read_call, response)
from linnet.serve.responses_store import ResponseStore

log = logging.getLogger(__name__)  # a bug's traceback, for whoever runs the server (its client gets the message)
MAX_BODY = 4 << 20
# What of a refused body (a 413's) is read and dropped before its connection closes: at most so
# many bytes, for at most so many seconds (nginx's lingering close reads for up to 30 s)
DRAIN_BYTES = 16 * MAX_BODY
DRAIN_SECONDS = 10.0


class OpenAIServer:
    def __init__(self, engine: Engine, model_name: str, api_key: str | None = None, tool_parser: str | None = None,
                 reasoning_parser: str | None = None, structure_in_reasoning: bool = False,
                 stored_responses: int = 1024, trust_request_chat_template: bool = False,
                 cors: CorsPolicy | None = None, template_sandbox: TemplateSandbox | None = None,
                 other_names: tuple = (), max_logprobs: int = MAX_LOGPROBS):
        """`tool_parser`: the name of the reader of the model's own tool calls (`tool_parsers`), which
        lets a request with tools leave tool_choice "auto"; `reasoning_parser`, of a reasoning model's
        thinking (`reasoning`), which chat replies then give apart as `reasoning_content`, and whose
        structured outputs hold only the answer, unless `structure_in_reasoning`; `stored_responses`:
        how many Responses are kept for `previous_response_id` (the newest; 0 keeps none);
        `trust_request_chat_template`: a chat body may bring its own `chat_template` (vLLM's flag),
        rendered in `template_sandbox` (by default one of 5 s and 512 MiB a render: a hostile
        template gets a 400, the server goes on); `cors`: which other origins' pages may call
        (default: vLLM's, any origin without credentials); `other_names`: more names a request may
        give the model by (vLLM's --served-model-name a b), its replies still naming it `model_name`;
        `max_logprobs`: the most logprobs a token a request may ask for (vLLM's --max-logprobs)."""
        self.max_logprobs = max_logprobs
        self.cors = cors or CorsPolicy()
        self.trust_request_chat_template = trust_request_chat_template
        self.own_templates = (template_sandbox or TemplateSandbox()) if trust_request_chat_template else None
        # A request with its own template is prepared on threads of its own, as many as the sandbox
        # renders at once: those waiting for a render hold none of the threads everyone's prompts
        # are made on (asyncio's, 6 on 2 cores), so a flood of slow templates delays only its like.
        self._template_threads = None if self.own_templates is None else ThreadPoolExecutor(
            self.own_templates.workers, thread_name_prefix="request-template")
        # Requests with a structure are submitted on threads of their own, as its matcher is compiled
        # then (seconds, for a large one): a flood of them delays only their like, not the prompts
        # everyone's requests are made on, and never the event loop.
        self._structure_threads = ThreadPoolExecutor(2, thread_name_prefix="request-structure")
        self.structure_in_reasoning = structure_in_reasoning
        self.responses = ResponseStore(stored_responses)
        from linnet.serve.reasoning import reasoning_parser as find_reasoning
        from linnet.serve.tool_parsers import tool_parser as find_parser

        self.engine = engine
        self.reasoning = None if reasoning_parser is None else find_reasoning(reasoning_parser)
        self.tool_parser = None if tool_parser is None else find_parser(tool_parser)
        if self.tool_parser is None and self.reasoning is not None and self.reasoning.reads_whole_reply:
            self.tool_parser = self.reasoning  # harmony's calls are its own messages
        self.model_name = model_name
        self.names = (model_name, *(n for n in other_names if n != model_name))
        self.model = engine.model
        self.tokenizer = engine.tokenizer
        self.api_key = api_key
        # the bytes a client sends for it: its UTF-8 (an environment's undecodable bytes as they were),
        # without the spaces around it, which no header value keeps
        self._key_bytes = None if api_key is None else api_key.strip().encode("utf-8", "surrogateescape")
        self.created = int(time.time())  # /v1/models' created: when the model was loaded to serve
        # Shutdown (shutdown.py): once `closing`, a request is refused with a 503; once `ending`, those
        # still answered (`_answering`, their tasks) are cancelled, each answering with a 503 as it goes.
        self.closing = self.ending = False
        self._answering: set = set()
        # (vLLM's /ping takes a POST too, as SageMaker's health checks send one)
        self.routes = {"/v1/models": {"GET": self._models}, "/health": {"GET": self._health},
                       "/ping": {"GET": self._health, "POST": self._health}, "/version": {"GET": self._version},
                       "/metrics": {"GET": self._metrics}, "/v1/completions": {"POST": self._generate},
                       "/v1/chat/completions": {"POST": self._generate}, "/v1/responses": {"POST": self._generate},
                       "/tokenize": {"POST": self._tokenize}, "/detokenize": {"POST": self._detokenize}}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        # Every response names its request (OpenAI's x-request-id): the client's own id where it sent one.
        headers = dict(scope.get("headers") or [])  # ASGI gives their names lowercased
        given = headers.get(b"x-request-id", b"")[:256]
        request_id = given or f"req-{uuid.uuid4().hex}".encode()
        origin = headers.get(b"origin", b"").decode("latin-1")  # a browser's page on another origin
        preflight = origin and scope["method"] == "OPTIONS" and b"access-control-request-method" in headers
        # (a preflight's answer names what it allows itself)
        added = [(b"x-request-id", request_id), *(self.cors.answer_headers(origin) if origin and not preflight else ())]

        started = False

        async def send_named(message):
            nonlocal started
            if message["type"] == "http.response.start":
                message, started = dict(message, headers=[*message.get("headers", []), *added]), True
            await send(message)

        if preflight:
            await self._preflight(origin, headers, send_named)
            return

        task = asyncio.current_task()
        self._answering.add(task)
        try:
            if self.closing:  # (a request on a connection opened before the server began to shut down)
                raise _shutting_down()
            await self._route(scope, headers, receive, send_named)
        except (Exception, asyncio.CancelledError) as err:  # the client's error, or a bug of ours: a 500 for this
            # request only; or the server's end: a 503
            failure = err if isinstance(err, ApiError) else self._cut_short(err)
            if started:  # past a stream's own error event (its writer's failure): end what was begun
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif failure.status == 413:  # its client may be sending the body still: read and dropped before the close
                await _json(send_named, failure.status, failure.body, failure.headers, more_body=True)
                await _drain(receive)
                await send_named({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                await _json(send_named, failure.status, failure.body, failure.headers)
        finally:
            self._answering.discard(task)

    def close(self) -> None:
        """The server shuts down: no request is taken from now on."""
        self.closing = True

    def busy(self) -> int:
        """How many requests are being answered."""
        return len(self._answering)

    def end_requests(self) -> None:
        """Ends every request being answered, each with a 503 (`_cut_short`); their engine requests
        are cancelled as they go, their rows freed."""
        self.ending = True
        for task in self._answering:
            task.cancel()

    def _cut_short(self, err: BaseException) -> ApiError:
        """The error a request answers with where `err` stopped it: a bug of ours (500), or the
        server's end (503, a cancel from `end_requests`). Any other cancel goes on up."""
        if not isinstance(err, asyncio.CancelledError):
            return _internal(err)
        if not self.ending:
            raise err
        uncancel = getattr(asyncio.current_task(), "uncancel", None)  # (Python 3.11's: the cancel is answered)
        if uncancel is not None:
            uncancel()
        return _shutting_down()

    async def _preflight(self, origin: str, headers: dict, send):
        """A browser's question before a cross-origin request: may this origin send this method with
        these headers? Asked without credentials, so before the API key is looked at."""
        status, allowed, refusal = self.cors.preflight(
            origin, headers[b"access-control-request-method"].decode("latin-1"),
            headers.get(b"access-control-request-headers", b"").decode("latin-1"))
        if refusal:
            await _json(send, status, ApiError(status, refusal).body, tuple(allowed))
        else:
            await send({"type": "http.response.start", "status": status,
                        "headers": [*allowed, (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.engine.start()
                if self.own_templates is not None:  # its first worker, started while no request waits for it
                    self._template_threads.submit(self.own_templates.warm)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.engine.stop()
                self._structure_threads.shutdown(wait=False, cancel_futures=True)
                if self.own_templates is not None:
                    self._template_threads.shutdown(wait=False, cancel_futures=True)
                    self.own_templates.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(self, scope, headers: dict, receive, send):
        path, method = scope["path"].rstrip("/") or "/", scope["method"]
        if self.api_key is not None and (path + "/").startswith("/v1/"):
            # before the route is looked up, as vLLM's middleware: without the key, nothing about the
            # routes (which exist, what they take) is told
            scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            # the scheme's case is the client's (RFC 9110); the key compared in constant time, as the
            # bytes sent (latin-1 gives them back) against the key's UTF-8
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("latin-1"), self._key_bytes):
                raise ApiError(401, "a valid API key is required: send 'Authorization: Bearer <key>'",
                               code="invalid_api_key")
        if path.startswith("/v1/models/"):  # one model's card
            methods = {"GET": self._models}
        elif path.startswith("/v1/responses/"):  # a kept Response, read or deleted; its input, read
            methods = {"GET": self._kept_response}
            if not path.endswith("/input_items"):
                methods["DELETE"] = self._forget_response
        elif path in self.routes:
            methods = self.routes[path]
        else:
            raise ApiError(404, f"no route {path}", code="not_found")
        if method == "HEAD" and "GET" in methods:  # a GET's headers alone (load balancers' probes send HEAD)
            send, method = _headers_only(send), "GET"
        elif method not in methods:
            allow = ", ".join([*methods, *(["HEAD"] if "GET" in methods else [])])
            raise ApiError(405, f"{path} takes {' or '.join(methods)}, not {method}", code="method_not_allowed",
                           headers=((b"allow", allow.encode()),))
        if method == "POST" and methods[method] != self._health:  # every other POST route reads a JSON body
            _check_upload(headers)
        await methods[method](path, receive, send)

    async def _health(self, path, receive, send):
        await _json(send, 200, {"status": "ok"})

    async def _version(self, path, receive, send):
        from linnet import __version__

        await _json(send, 200, {"version": __version__})

    async def _models(self, path, receive, send):
        cards = [{"id": name, "object": "model", "created": self.created, "owned_by": "linnet",
                  "max_model_len": self.model.max_seq} for name in self.names]
        asked = path[len("/v1/models/"):]
        if path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": cards})
        elif asked in self.names:
            await _json(send, 200, cards[self.names.index(asked)])
        else:
            raise ApiError(404, f"the model {asked!r} does not exist", "model", "model_not_found")

    async def _kept_response(self, path, receive, send):
        if path.endswith("/input_items"):
            await _json(send, 200, self.responses.input_items(_response_id(path.removesuffix("/input_items"))))
            return
        await _json(send, 200, self.responses.response(_response_id(path)))

    async def _forget_response(self, path, receive, send):
        await _json(send, 200, self.responses.delete(_response_id(path)))

    async def _metrics(self, path, receive, send):
        data = prometheus_text(self.engine, self.model_name).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain; version=0.0.4"),
                                (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    async def _body(self, receive) -> dict:
        body = await _read_json(receive)
        if body.get("chat_template") is not None and not self.trust_request_chat_template:
            raise ApiError(400, "a request's own 'chat_template' needs the server started with "
                                "--trust-request-chat-template; this one uses the model's", "chat_template")
        model = body.get("model")
        if model is not None and not isinstance(model, str):  # a malformed field (vLLM's schema): no unknown model
            raise ApiError(400, f"'model' must be a string, not {shown(model)}", "model")
        if model is not None and model not in self.names:
            serves = " or ".join(repr(name) for name in self.names)
            raise ApiError(404, f"the model {shown(model)} does not exist; this server serves {serves}",
                           "model", "model_not_found")
        return body

    async def _tokenize(self, path, receive, send):
        """vLLM's /tokenize: a prompt (or chat messages, through the template) to token ids."""
        body = await self._body(receive)
        if self.tokenizer is None:
            raise ApiError(400, "this model has no tokenizer")
        if "messages" in body:
            ids = await self._prepared(body, chat_prompt, body, self.tokenizer,  # (as `_generate`'s, off the loop)
                                       self.own_templates)
        elif isinstance(body.get("prompt"), str):
            special = _boolean(body, "add_special_tokens", True)
            ids = await asyncio.to_thread(encode_text, self.tokenizer, body["prompt"], "prompt", special)
        else:
            raise ApiError(400, "send 'prompt' (a string) or 'messages'", "prompt")
        answer = {"count": len(ids), "max_model_len": self.model.max_seq, "tokens": ids}
        # vLLM's: each token as the vocabulary spells it (byte-level BPE's `Ġ` for a space)
        if _boolean(body, "return_token_strs", False):
            answer["token_strs"] = [self.tokenizer.id_to_token(t) for t in ids]
        await _json(send, 200, answer)

    async def _detokenize(self, path, receive, send):
        body = await self._body(receive)
        if self.tokenizer is None:
            raise ApiError(400, "this model has no tokenizer")
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(is_int(t) and 0 <= t < self.model.vocab for t in ids):
            raise ApiError(400, f"'tokens' must be a list of token ids in [0, {self.model.vocab})", "tokens")
        await _json(send, 200, {"prompt": self.tokenizer.decode(ids)})

    async def _generate(self, path, receive, send):
        body = await self._body(receive)
        # a Responses body, with the conversation it continues, runs as the chat it means
        responses = read_call(body, self.responses) if path == "/v1/responses" else None
        if responses is not None:
            body = chat_body(responses)
        chat = responses is not None or path.endswith("chat/completions")
        length = "max_output_tokens" if responses is not None else length_field(body)
        try:
            # on a thread of its own: a long prompt's template and tokens (and a structure's grammar)
            # would hold the event loop, and every stream with it (a 4 MB prompt: 2 s)
            if chat:
                job = await self._prepared(body, chat_job, body, self.tokenizer, self.model.max_seq, self.tool_parser,
                                           self.reasoning, self.structure_in_reasoning, self.own_templates)
            else:
                job = await asyncio.to_thread(completion_job, body, self.tokenizer, self.model.max_seq)
            for req in job.requests:
                check_fits(req, self.model.vocab, self.model.max_seq, chat, length)
                check_logprobs(req, self.max_logprobs, chat)
        except ApiError as err:
            if responses is not None:  # the fields it speaks of as chat's are the Responses body's
                err.names_param("messages", "input")
                err.names_param("response_format", "text.format")
            raise
        fields = body_fields(chat, length, body)
        if responses is not None and fields["structure"] == "response_format":
            fields["structure"] = "text.format"
        try:
            if any(req.structure is not None for req in job.requests):
                submitted = self._structure_threads.submit(self._submit, job.requests, asyncio.get_running_loop())
                try:
                    streams = await asyncio.wrap_future(submitted)
                except asyncio.CancelledError:  # ended while its matcher compiles (the server's end): the thread
                    # goes on, and what it submits is cancelled once it has (one not begun never runs)
                    submitted.add_done_callback(self._cancel_submitted)
                    raise
            else:  # (at once: nothing of a plain request's submission takes long)
                streams = self._submit(job.requests, None)
        except RequestError as err:  # checked above; whatever still slips through (a structure) is the client's
            raise refused(err, err.request, fields) from None
        # A client that goes away takes its requests with it: their rows go to others.
        watcher = asyncio.create_task(self._cancel_on_disconnect(receive, [s.completion for s in streams]))
        try:
            if body.get("stream"):
                await self._stream(job, streams, chat, send, fields, responses)
            else:
                await self._complete(job, streams, chat, send, responses, fields)
        finally:
            watcher.cancel()
            for s in streams:
                if s.completion.finish_reason is None:
                    self.engine.cancel(s.completion.id)

    def _submit(self, requests: list, loop) -> list:
        """Each request's stream, its tokens told on `loop` (None: the running one). Called on a
        thread where they have a structure, whose matcher is compiled at submission (llguidance
        lets go of the GIL): a large one (60,000 choices: 8 s) held the event loop, every stream
        and /health with it. Where one is refused, those before it are cancelled, and its
        RequestError names it (`err.request`)."""
        streams = []
        for req in requests:
            try:
                streams.append(self.engine.stream(req, loop))
            except BaseException as err:
                for s in streams:
                    self.engine.cancel(s.completion.id)
                if isinstance(err, RequestError):
                    err.request = req
                raise
        return streams

    def _cancel_submitted(self, submitted) -> None:
        """Cancels the streams a `_submit` on a structure's thread made after its request was ended."""
        if not submitted.cancelled() and submitted.exception() is None:
            for s in submitted.result():
                self.engine.cancel(s.completion.id)

    async def _prepared(self, body: dict, prepare, *args):
        """`prepare(*args)` on a thread: the request templates' own where `body` brings one."""
        threads = self._template_threads if body.get("chat_template") is not None else None
        return await asyncio.get_running_loop().run_in_executor(threads, functools.partial(prepare, *args))

    async def _cancel_on_disconnect(self, receive, comps: list):
        while (await receive())["type"] != "http.disconnect":
            pass
        for comp in comps:
            if comp.finish_reason is None:
                self.engine.cancel(comp.id)

    async def _complete(self, job: Job, streams: list, chat: bool, send, responses: ResponsesCall | None,
                        fields: dict):
        """The whole reply; `fields`: the body's names for the Request's fields (`body_fields`), for a
        request that ended in the client's error."""
        async def drain(stream):
            async for _ in stream:
                pass
            if stream.completion.finish_reason == "error":  # the request fails: its other choices' rows go now
                for s in streams:
                    if s.completion.finish_reason is None:
                        self.engine.cancel(s.completion.id)
            return stream.completion

        comps = await asyncio.gather(*(drain(s) for s in streams))
        failed = [c for c in comps if c.finish_reason == "error"]
        if failed:
            raise _failure(failed[0], fields)
        if responses is not None:
            message, finish = chat_message(job, comps[0], self.tokenizer)
            made = response(responses.body, job, comps, self.model_name, message, finish, self.tokenizer)
            self._keep(responses, made, comps)
            await _json(send, 200, made)
            return
        respond = chat_response if chat else completion_response
        await _json(send, 200, respond(job, comps, self.model_name, self.tokenizer))

    async def _stream(self, job: Job, streams: list, chat: bool, send, fields: dict,
                      responses: ResponsesCall | None = None):
        """The reply as server-sent events; `fields` as `_complete`'s: a choice that fails sends the
        error the same request gets unstreamed."""
        comps = [s.completion for s in streams]
        if responses is not None:  # Responses' typed events, the last one the whole Response
            writer, job.include_usage = ResponseWriter(responses.body, job, self.model_name, self.tokenizer), True
        else:
            # (a chunk's continuous usage is its choice's, as vLLM's: what `choices` below has streamed of it)
            writer = ChunkWriter(chat, self.model_name, self.tokenizer, job.include_usage,
                                 (lambda i: choice_usage(comps[i], choices[i].stream.tokens))
                                 if job.continuous_usage else None, job.token_ids)
        # (a writer that cannot be made is the plain 500 the route's caller sends: nothing has been sent yet)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})

        async def event(chunks):
            for chunk in chunks if isinstance(chunks, list) else [chunks]:
                if chunk is None:
                    continue
                named = f"event: {chunk['type']}\n" if getattr(writer, "sse_events", False) and "type" in chunk else ""
                await send({"type": "http.response.body", "body": f"{named}data: {json.dumps(chunk)}\n\n".encode(),
                            "more_body": True})

        merged: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, stream):
            try:
                async for tokens, reason in stream:
                    await merged.put((i, tokens, reason))
            finally:
                await merged.put((i, None, "closed"))

        pumps = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        # An echo goes first; with logprobs, once its prompt is scored: with the choice's first news.
        unechoed = set(range(len(streams))) if job.echo else set()
        try:  # from here on, a bug of ours is told in the stream its 200 has begun
            # A request may keep every special token (harmony's do: its parser reads its markers); otherwise
            # only the tool parser's markers are written into the text.
            markers = marker_ids(job, self.tokenizer)
            choices = [ChoiceDeltas(job, c, self.tokenizer, chat, len(job.echo[i]) if job.echo else 0, markers)
                       for i, c in enumerate(comps)]
            for i in range(len(streams)):
                await event(writer.start(i))
                if job.echo and not job.echo_logprobs:
                    await event(writer.piece(i, job.echo[i]))
                    unechoed.discard(i)
            open_choices = len(streams)
            while open_choices:
                i, tokens, reason = await merged.get()
                if reason == "closed":
                    open_choices -= 1
                    continue
                comp = comps[i]
                if comp.finish_reason == "error":  # its error once, at its end (news read after it failed says none)
                    if reason is not None:
                        await event(writer.failure(_failure(comp, fields)))
                    continue
                if i in unechoed and len(job.prompt_scores(comps, i)) == len(comp.request.prompt):
                    prompt = echoed_prompt(job, comps, i, self.tokenizer)
                    await event(writer.piece(i, job.echo[i], [], [], prompt=prompt))
                    unechoed.discard(i)
                delta = choices[i].step(tokens) if reason is None else choices[i].end(tokens)
                count = choices[i].stream.tokens
                lps = None if comp.request.logprobs is None else comp.logprobs[count - len(tokens):count]
                if delta.text or lps or delta.thought:
                    await event(writer.piece(i, delta.text, lps, delta.offsets, reasoning=delta.thought,
                                             reply=(choices[i].stream.text, delta.out, reason is not None)))
                for piece in delta.calls:
                    await event(writer.call(i, piece))
                if reason is not None:
                    await event(writer.piece(i, "", reason=delta.why, stop_reason=comp.stop_reason))
            if job.include_usage:
                await event(writer.usage(job, comps))
            if responses is not None and not any(c.finish_reason == "error" for c in comps):
                self._keep(responses, writer.final, comps)
        except (Exception, asyncio.CancelledError) as err:  # a bug of ours, or the server's end, once the response
            # has started: the error goes in the stream, as a failed choice's (a Responses stream then ends with
            # "response.failed"), the rows freed
            await event(writer.failure(self._cut_short(err)))
            if responses is not None and writer.final is None:
                await event(writer.usage(job, comps))
        finally:
            for p in pumps:
                p.cancel()
        # chat and completions end with [DONE]; a Responses stream ends with its last event
        await send({"type": "http.response.body", "body": b"" if responses is not None else b"data: [DONE]\n\n",
                    "more_body": False})

    def _keep(self, call: ResponsesCall, made: dict, comps: list) -> None:
        """Keeps a finished Response for later ones to continue, unless its body says store: false,
        or its client went away before its end (`comps`, its choices, cancelled): its text cut there
        was kept as a "completed" turn, for a later Response to continue as if the model had ended it."""
        if call.stored and not any(c.finish_reason == "cancelled" for c in comps):
            self.responses.put(made, conversation_after(call, made["output"]), input_items(call.body))


def _internal(err: Exception) -> ApiError:
    """The 500 of a bug of ours, streamed or not: the same body either way; its traceback goes to the
    server's log (called where `err` is being handled)."""
    log.error("internal error answering a request", exc_info=err)
    return ApiError(500, f"internal error: {err}", kind="server_error")


def _shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", code="server_shutting_down", kind="server_error",
                    headers=((b"connection", b"close"),))


def _failure(comp, fields: dict) -> ApiError:
    """The error of a request whose choice `comp` failed: the client's 400 where what it asked for
    could not be met (`fields`: the body's names for the Request's fields), else a 500."""
    if comp.error_field is not None:
        return ApiError(400, comp.error, fields.get(comp.error_field, comp.error_field))
    return ApiError(500, comp.error or "the request failed", kind="server_error")


def _response_id(path: str) -> str:
    response_id = path[len("/v1/responses/"):]
    if "/" in response_id:
        raise ApiError(404, f"no route {path}", code="not_found")
    return response_id


# A 413 closes its connection, once the rest of its body is drained (`_drain`), not kept alive to
# read and drop the whole of it (as uvicorn would)
_TOO_LARGE = dict(code="request_too_large", headers=((b"connection", b"close"),))


def _check_upload(headers: dict) -> None:
    """Before a POST's body is read: it must be declared JSON (vLLM's rule, and its 400: a form
    or text body is refused, not parsed as if it were JSON), and not declared larger than any
    request may be (413 at once, rather than once MAX_BODY of it has arrived)."""
    declared = headers.get(b"content-type", b"").decode("latin-1")
    media = declared.split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ApiError(400, "Unsupported Media Type: only 'application/json' is allowed, "
                            f"not {json.dumps(declared) if declared else 'a body without a content-type'}",
                       code="unsupported_media_type")
    length = headers.get(b"content-length", b"")
    if length.isdigit() and int(length) > MAX_BODY:
        raise ApiError(413, f"the request body is {int(length)} bytes; at most {MAX_BODY} are taken", **_TOO_LARGE)


async def _read_json(receive) -> dict:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:  # (sent chunked, without a length)
            raise ApiError(413, f"the request body is larger than {MAX_BODY} bytes", **_TOO_LARGE)
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    try:  # (ValueError: JSON's errors, and an integer of more digits than Python reads; RecursionError: nesting)
        body = json.loads(b"".join(chunks) or b"null")
    except (ValueError, RecursionError) as err:
        raise ApiError(400, f"the body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


async def _drain(receive) -> None:
    """The rest of a refused request's body read and dropped, until it ends or its client goes, or
    DRAIN_BYTES of it or DRAIN_SECONDS have passed. A connection closed with a body's bytes
    unread is reset by the kernel, the answer sent on it lost to a client that sends its whole
    body before reading (Python's http.client, httpx): each such client met a reset, not its 413."""
    async def read():
        dropped = 0
        while dropped <= DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body"):
                return
            dropped += len(message.get("body", b""))

    try:
        await asyncio.wait_for(read(), DRAIN_SECONDS)
    except asyncio.TimeoutError:
        pass


async def _json(send, status: int, body: dict, headers: tuple = (), more_body: bool = False):
    """`body` answered with `status`; with `more_body`, the response left for its caller to end (uvicorn
    closes a Connection: close response's connection at its end)."""
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": data, "more_body": more_body})


def _headers_only(send):
    """`send` for a HEAD request: the GET's status and headers, its body left out."""
    async def send_head(message):
        if message["type"] == "http.response.body":
            message = dict(message, body=b"", more_body=False)
        await send(message)
    return send_head


def serve(model, name: str, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          tool_parser: str | None = None, reasoning_parser: str | None = None, structure_in_reasoning: bool = False,
          stored_responses: int = 1024, trust_request_chat_template: bool = False, log_level: str = "info",
          access_log: bool = True, cors: CorsPolicy | None = None, ssl_certfile: str | None = None,
          ssl_keyfile: str | None = None, other_names: tuple = (), max_logprobs: int = MAX_LOGPROBS,
          shutdown_timeout: float = 0.0, **engine_options) -> None:
    """Serves `model` until SIGTERM or Ctrl-C, then lets the requests in flight finish for up to
    `shutdown_timeout` seconds (shutdown.py)."""
    import uvicorn

    from linnet.serve.shutdown import DrainingServer

    engine = Engine(model, **engine_options)
    start = time.perf_counter()
    # every pass size the engine will use, and every draw a request may ask for (logprobs, a
    # structure, penalties, a bias), compiled before the first request; what prompt logprobs' passes
    # run (half of a cold JAX warmup, for the few requests that ask) on a thread while it serves
    engine.warmup(logprobs=True, structured=True, adjusted=True)
    engine.warm_scoring_later(lambda seconds: print(f"linnet: {name}: prompt logprobs' passes compiled ahead in "
                                                    f"{seconds:.0f} s", flush=True))
    print(f"linnet: {name} ready in {time.perf_counter() - start:.0f} s (warmup)", flush=True)
    if model.tokenizer is None:  # said at the start, not found out from the first request's 400
        print(f"linnet: note: {name} has no tokenizer: prompts are taken as token ids (/v1/completions) and chats "
              f"and text are refused (--tokenizer names a model directory or GGUF to take one from)", flush=True)
    app = OpenAIServer(engine, name, api_key=api_key, tool_parser=tool_parser, reasoning_parser=reasoning_parser,
                       structure_in_reasoning=structure_in_reasoning, stored_responses=stored_responses,
                       trust_request_chat_template=trust_request_chat_template, cors=cors, other_names=other_names,
                       max_logprobs=max_logprobs)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                            ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile)
    server = DrainingServer(config, app, shutdown_timeout)
    server.run()
    if not server.started:  # (as uvicorn.run: the address could not be had, said in uvicorn's log)
        raise SystemExit(3)
