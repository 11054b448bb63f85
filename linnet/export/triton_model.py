"""Triton's Python-backend model for a Linnet card (the `model.py` that `linnet export --to triton`
writes imports this class).

One Linnet engine per model instance, stepping on its own thread; each Triton request becomes an
engine request, so requests that arrive together share the engine's passes. Responses go back
through the request's response sender (the model is decoupled): one per piece of text when the
request asks to `stream`, else one with the whole text; each request ends with the final flag.
A bad request gets a `TritonError` with the same message the OpenAI server would give; the others
go on. `triton_python_backend_utils` exists only inside Triton's Python stub, so it is imported when
Triton calls `initialize`.
"""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils

        from linnet import nest
        from linnet.serve import Engine

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        self.name = config.get("name", "linnet")
        p = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        backend = p.get("backend", "torch")
        self.model = nest.load(p["card"], backend=backend, numerics="fast", compile=backend == "torch",
                               generics={"Batch": int(p.get("batch", 32)), "MaxSeq": int(p.get("max_seq", 4096)),
                                         "T": p.get("dtype", "bf16")},
                               cast_dtype=True, weights=p.get("weights") or None,
                               tokenizer=p.get("tokenizer") or True)
        self.engine = Engine(self.model)
        self.engine.warmup()
        self.engine.start()
        self.loop = asyncio.new_event_loop()  # the engine's listeners are asyncio queues
        self.loop_thread = threading.Thread(target=self.loop.run_forever, name="linnet-triton", daemon=True)
        self.loop_thread.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                req, prompt_text, stream, echo = self._parse(request)
            except Exception as err:  # an ApiError or RequestError: this request only
                sender.send(self._failure(str(err)), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            asyncio.run_coroutine_threadsafe(self._respond(req, prompt_text, stream, echo, sender), self.loop)
        return None

    def finalize(self) -> None:
        self.engine.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)

    # ---------------------------------------------------------------- one request

    def _input(self, request, name: str):
        tensor = self.pb.get_input_tensor_by_name(request, name)
        if tensor is None:
            return None
        value = tensor.as_numpy().reshape(-1)[0]
        return value.decode("utf-8") if isinstance(value, bytes) else value

    def _parse(self, request):
        from linnet.serve.openai_api import ApiError, check_fits, completion_job

        text = self._input(request, "text_input")
        if not isinstance(text, str) or not text:
            raise ApiError(400, "text_input must be a non-empty string", "text_input")
        raw = self._input(request, "sampling_parameters")
        try:
            sampling = json.loads(raw) if raw else {}
        except json.JSONDecodeError as err:
            raise ApiError(400, f"sampling_parameters is not valid JSON: {err}", "sampling_parameters") from None
        if not isinstance(sampling, dict):
            raise ApiError(400, "sampling_parameters must be a JSON object", "sampling_parameters")
        job = completion_job({**sampling, "prompt": text, "echo": False}, self.model.tokenizer, self.model.max_seq)
        if len(job.requests) != 1:
            raise ApiError(400, "one text_output per request: n must be 1", "n")
        req = job.requests[0]
        check_fits(req, self.model.vocab, self.model.max_seq)
        stream = bool(self._input(request, "stream") or False)
        echo = not bool(self._input(request, "exclude_input_in_output") or False)
        return req, text, stream, echo

    def _failure(self, message: str):
        return self.pb.InferenceResponse(output_tensors=[], error=self.pb.TritonError(message))

    def _response(self, text: str):
        out = self.pb.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))
        return self.pb.InferenceResponse(output_tensors=[out])

    async def _respond(self, req, prompt_text: str, stream: bool, echo: bool, sender):
        from linnet.serve.openai_replies import TextStream

        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        pieces = TextStream(self.model.tokenizer, req.prompt, req.stop)
        tokens = self.engine.stream(req)
        first = echo
        async for new, reason in tokens:
            if stream and reason is None:
                piece = pieces.push(new)
                if piece:
                    sender.send(self._response((prompt_text if first else "") + piece))
                    first = False
        comp = tokens.completion
        if comp.finish_reason == "error":
            sender.send(self._failure(comp.error or "failed"), flags=final)
            return
        if stream:
            tail = pieces.finish(comp.text)
            sender.send(self._response((prompt_text if first else "") + tail), flags=final)
        else:
            sender.send(self._response((prompt_text if echo else "") + (comp.text or "")), flags=final)
