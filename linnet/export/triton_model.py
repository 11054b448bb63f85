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
                               cast_dtype=True, weights=p.get("weights") or None, seed=int(p.get("seed", 0)),
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
                req, prompt_text, stream, echo, extra = self._parse(request)
            except Exception as err:  # an ApiError or RequestError: this request only
                sender.send(self._failure(str(err)), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            asyncio.run_coroutine_threadsafe(self._respond(req, prompt_text, stream, echo, extra, sender), self.loop)
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
        """(engine request, prompt text, stream, echo, the extra outputs asked for), as Triton's vLLM
        backend reads a request: the prompt is echoed unless `exclude_input_in_output`, and by
        default only when not streaming (echoing a stream is refused); the sampling fields come
        from `sampling_parameters`, else from the request's own parameters (Triton's /generate)."""
        from linnet.serve.openai_api import ApiError, check_fits, completion_job

        text = self._input(request, "text_input")
        if not isinstance(text, str) or not text:
            raise ApiError(400, "text_input must be a non-empty string", "text_input")
        stream = bool(self._input(request, "stream") or False)
        exclude = self._input(request, "exclude_input_in_output")
        echo = not stream if exclude is None else not bool(exclude)
        if echo and stream:
            raise ApiError(400, "when streaming, exclude_input_in_output = false is not allowed: the prompt "
                                "is not echoed into a stream", "exclude_input_in_output")
        raw = self._input(request, "sampling_parameters")
        if raw is None:
            raw = request.parameters()
        try:
            sampling = json.loads(raw) if raw else {}
        except json.JSONDecodeError as err:
            raise ApiError(400, f"sampling_parameters is not valid JSON: {err}", "sampling_parameters") from None
        if not isinstance(sampling, dict):
            raise ApiError(400, "sampling_parameters must be a JSON object", "sampling_parameters")
        job = completion_job({**typed_parameters(sampling), "prompt": text, "echo": False}, self.model.tokenizer,
                             self.model.max_seq)
        if len(job.requests) != 1:
            raise ApiError(400, "one text_output per request: n must be 1", "n")
        req = job.requests[0]
        check_fits(req, self.model.vocab, self.model.max_seq)
        extra = {name for name in EXTRA_OUTPUTS if self._input(request, f"return_{name}")}
        if "logprobs" in extra and req.logprobs is None:  # as the vLLM backend's: "null" unless logprobs is asked
            extra = (extra - {"logprobs"}) | {NO_LOGPROBS}
        if "cumulative_logprob" in extra and req.logprobs is None:
            req.logprobs = 0  # the drawn tokens' own logprobs, summed below
        return req, text, stream, echo, extra

    def _failure(self, message: str):
        return self.pb.InferenceResponse(output_tensors=[], error=self.pb.TritonError(message))

    def _response(self, text: str, extra: set, req, comp, start: int, end: int):
        """One response: `text_output`, and the extra outputs asked for, as the vLLM backend gives
        them, for the tokens comp.tokens[start:end] drawn since the response before (a stream's
        finish_reason is "None" until its last response; num_output_tokens counts those tokens,
        logprobs holds theirs, cumulative_logprob sums every drawn token's so far)."""
        outputs = [self.pb.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
        if "finish_reason" in extra:
            reason = str(comp.finish_reason)  # "None" while it runs, as the vLLM backend's str(None)
            outputs.append(self.pb.Tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)))
        if "cumulative_logprob" in extra:
            total = sum(t.logprob for t in comp.logprobs[:end])  # (the engine may have drawn more since)
            outputs.append(self.pb.Tensor("cumulative_logprob", np.array([total], dtype=np.float32)))
        if "logprobs" in extra or NO_LOGPROBS in extra:
            value = "null" if NO_LOGPROBS in extra else \
                json.dumps(vllm_logprobs(comp.logprobs[start:end], self.model.tokenizer))
            outputs.append(self.pb.Tensor("logprobs", np.array([value.encode("utf-8")], dtype=np.object_)))
        if "num_input_tokens" in extra:
            outputs.append(self.pb.Tensor("num_input_tokens", np.array([len(req.prompt)], dtype=np.uint32)))
        if "num_output_tokens" in extra:
            outputs.append(self.pb.Tensor("num_output_tokens", np.array([end - start], dtype=np.uint32)))
        return self.pb.InferenceResponse(output_tensors=outputs)

    async def _respond(self, req, prompt_text: str, stream: bool, echo: bool, extra: set, sender):
        """Runs `req` and answers it. Every request ends with a final response, whatever happens: an
        exception here would only be kept in the future `execute` drops, and Triton's client would
        wait for the final flag for ever."""
        from linnet.serve.openai_api import refused
        from linnet.serve.request import RequestError

        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            tokens = self.engine.stream(req)
        except RequestError as err:  # what only the engine checks: a structure that does not compile
            sender.send(self._failure(str(refused(err, req, {}))), flags=final)
            return
        try:
            await self._generate(req, tokens, prompt_text, stream, echo, extra, sender)
        except Exception as err:  # (as Triton's vLLM backend does: said to the client, not lost)
            sender.send(self._failure(f"the request failed: {err}"), flags=final)

    async def _generate(self, req, tokens, prompt_text: str, stream: bool, echo: bool, extra: set, sender):
        from linnet.serve.openai_replies import TextStream

        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        # special tokens kept in the stream as in the whole text, where the request keeps them
        pieces = TextStream(self.model.tokenizer, req.prompt, req.stop, special=not req.skip_special_tokens)
        sent = drawn = 0  # tokens the responses so far stand for; tokens drawn
        async for new, reason in tokens:
            if sender.is_cancelled():  # the client has gone (as the vLLM backend, its request ends: its row is freed)
                self.engine.cancel(tokens.completion.id)
                sender.send(self.pb.InferenceResponse(output_tensors=[], error=self.pb.TritonError(
                    "Request was cancelled", code=self.pb.TritonError.CANCELLED)), flags=final)
                return
            drawn += len(new)
            if stream and reason is None:
                piece = pieces.push(new)
                if piece:
                    sender.send(self._response(piece, extra, req, tokens.completion, sent, drawn))
                    sent = drawn
        comp = tokens.completion
        if comp.finish_reason == "error":
            sender.send(self._failure(comp.error or "failed"), flags=final)
            return
        if stream:
            sender.send(self._response(pieces.finish(comp.text), extra, req, comp, sent, len(comp.tokens)),
                        flags=final)
        else:
            text = (prompt_text if echo else "") + (comp.text or "")
            sender.send(self._response(text, extra, req, comp, 0, len(comp.tokens)), flags=final)


# The outputs a request may ask for with a `return_<name>` input, as of Triton's vLLM backend.
EXTRA_OUTPUTS = ("finish_reason", "cumulative_logprob", "logprobs", "num_input_tokens", "num_output_tokens")
NO_LOGPROBS = "logprobs: null"  # return_logprobs without sampling_parameters' logprobs: the output says "null"


def vllm_logprobs(lps: list, tokenizer) -> list:
    """The vLLM backend's `logprobs` output for some drawn tokens (`TokenLogprob`s): per token
    {id: {logprob, rank, decoded_token}} holding the drawn token first, then its top alternatives
    ranked 1, 2, ... (vLLM's SampleLogprobs, the ids as JSON keys). The drawn token's rank is
    vLLM's, 1 + how many tokens were likelier, whether or not it is among the alternatives (the
    draw ranks it on the device)."""
    from linnet.serve.openai_replies import _token_text

    text = _token_text(tokenizer)
    out = []
    for lp in lps:
        ranked = {t: r for r, (t, _) in enumerate(lp.top, 1)}
        entry = {str(lp.token): {"logprob": lp.logprob, "rank": lp.rank,
                                 "decoded_token": text(lp.token)}}
        for t, v in lp.top:
            entry.setdefault(str(t), {"logprob": v, "rank": ranked[t], "decoded_token": text(t)})
        out.append(entry)
    return out

# Triton's clients (the vLLM backend's own samples among them) send the sampling fields' numbers as
# strings ({"temperature": "0.1", "max_tokens": "5"}); the vLLM backend converts them to each field's type.
_NUMBER_FIELDS = {"max_tokens": int, "min_tokens": int, "top_k": int, "seed": int, "n": int, "logprobs": int,
                  "temperature": float, "top_p": float, "min_p": float, "presence_penalty": float,
                  "frequency_penalty": float, "repetition_penalty": float}
_FLAG_FIELDS = ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output")


def typed_parameters(sampling: dict) -> dict:
    """`sampling` with numbers and flags given as strings in their own types, and nulls left out
    (the default, as the vLLM backend takes them); a string that is not one is a 400."""
    from linnet.serve.openai_api import ApiError

    out = {}
    for key, value in sampling.items():
        if value is None:
            continue
        if isinstance(value, str) and key in _NUMBER_FIELDS:
            try:
                value = _NUMBER_FIELDS[key](value)
            except ValueError:
                kind = "an integer" if _NUMBER_FIELDS[key] is int else "a number"
                raise ApiError(400, f"{key!r} must be {kind}, not {value!r}", key) from None
        elif isinstance(value, str) and key in _FLAG_FIELDS:
            if value.lower() not in ("true", "false"):
                raise ApiError(400, f"{key!r} must be true or false, not {value!r}", key)
            value = value.lower() == "true"
        out[key] = value
    return out
