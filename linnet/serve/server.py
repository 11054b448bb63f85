"""The OpenAI-compatible HTTP server: `linnet serve CARD --batch 32 --max-seq 4096 --port 8000`.

A plain ASGI application (run by uvicorn) over one `Engine` stepping on its
own thread. Routes: GET /v1/models, GET /health, POST /v1/completions,
POST /v1/chat/completions (both with "stream": true as server-sent events).
A bad request gets OpenAI's error object with its status; it never stops the
engine or the other requests.
"""

from __future__ import annotations

import json
import time

from linnet.serve.engine import Engine
from linnet.serve.openai_api import (ApiError, chat_request, chat_response, check_fits, completion_request,
                                     completion_response, finish_reason, new_id)

MAX_BODY = 4 << 20


class TextStream:
    """Token ids to text as they come, holding back what may yet turn out to be a stop string."""

    def __init__(self, tokenizer, stops: list):
        self.decoder = tokenizer.incremental_decoder(skip_special_tokens=True) if tokenizer else None
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0

    def push(self, tokens: list) -> str:
        if self.decoder is None:
            return ""
        for t in tokens:
            self.text += self.decoder.push(t)
        safe = len(self.text) - self.hold
        return self._emit(safe)

    def finish(self, final_text: str | None) -> str:
        if self.decoder is not None:
            self.text += self.decoder.flush()
        if final_text is not None:
            self.text = final_text
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        out = self.text[self.sent:upto]
        self.sent = upto
        return out


class OpenAIServer:
    def __init__(self, engine: Engine, model_name: str):
        self.engine = engine
        self.model_name = model_name
        self.model = engine.model
        self.tokenizer = engine.tokenizer

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            await self._route(scope, receive, send)
        except ApiError as err:
            await _json(send, err.status, err.body)
        except Exception as err:  # a bug answers 500 for this request only
            await _json(send, 500, {"error": {"message": f"internal error: {err}", "type": "server_error",
                                              "param": None, "code": None}})

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.engine.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.engine.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(self, scope, receive, send):
        path, method = scope["path"].rstrip("/") or "/", scope["method"]
        routes = {"/v1/models": "GET", "/health": "GET", "/v1/completions": "POST", "/v1/chat/completions": "POST"}
        if path not in routes:
            raise ApiError(404, f"no route {path}", code="not_found")
        if method != routes[path]:
            raise ApiError(405, f"{path} takes {routes[path]}, not {method}", code="method_not_allowed")
        if path == "/health":
            await _json(send, 200, {"status": "ok"})
            return
        if path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [
                {"id": self.model_name, "object": "model", "created": 0, "owned_by": "linnet",
                 "max_model_len": self.model.max_seq}]})
            return
        body = await _read_json(receive)
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise ApiError(404, f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                           "model", "model_not_found")
        chat = path.endswith("chat/completions")
        req = chat_request(body, self.tokenizer) if chat else completion_request(body, self.tokenizer, self.model.vocab)
        check_fits(req, self.model.vocab, self.model.max_seq)
        if body.get("stream"):
            await self._stream(req, chat, send)
        else:
            await self._complete(req, chat, send)

    async def _complete(self, req, chat: bool, send):
        tokens_stream = self.engine.stream(req)
        async for _ in tokens_stream:
            pass
        comp = tokens_stream.completion
        if comp.finish_reason == "error":
            raise ApiError(500, comp.error or "the request failed", kind="server_error")
        text = comp.text
        if text is None:  # no tokenizer: token ids are all there is
            text = ""
        respond = chat_response if chat else completion_response
        await _json(send, 200, respond(comp, self.model_name, text, self.tokenizer))

    async def _stream(self, req, chat: bool, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        rid, created = new_id("chatcmpl" if chat else "cmpl"), int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        async def event(text: str | None, reason: str | None, first: bool = False):
            if chat:
                delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            chunk = {"id": rid, "object": kind, "created": created, "model": self.model_name, "choices": [choice]}
            await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                        "more_body": True})

        stream = TextStream(self.tokenizer, req.stop)
        if chat:
            await event(None, None, first=True)
        tokens_stream = self.engine.stream(req)
        async for tokens, reason in tokens_stream:
            if reason is None:
                text = stream.push(tokens)
                if text:
                    await event(text, None)
        comp = tokens_stream.completion
        tail = stream.finish(comp.text)
        if tail:
            await event(tail, None)
        await event(None, finish_reason(comp))
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _read_json(receive) -> dict:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise ApiError(413, f"the request body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    try:
        body = json.loads(b"".join(chunks) or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


async def _json(send, status: int, body: dict):
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def serve(model, name: str, host: str = "127.0.0.1", port: int = 8000, **engine_options) -> None:
    import uvicorn

    engine = Engine(model, **engine_options)
    start = time.perf_counter()
    engine.warmup()  # every pass size the engine will use, compiled before the first request
    print(f"linnet: {name} ready in {time.perf_counter() - start:.0f} s (warmup)", flush=True)
    uvicorn.run(OpenAIServer(engine, name), host=host, port=port, log_level="info")
