"""Structured outputs: a request's text held to a JSON schema, a regular expression, a choice of
strings or a grammar, by masking the logits of every draw (llguidance's matcher).

Each such request has its own matcher, which follows its tokens: before each draw the host asks
the step's matchers, all at once on llguidance's threads, which tokens may come next, and the
sampler bans the others on the device (a packed mask, one of `runners.logit_adjustments`); after
it, each matcher takes its drawn token. Once a matcher has a complete output it stops, and so
does its request. The masks depend only on the tokens already taken, so they are made while the
model's step runs: on a thread, where the draw comes after the step on the host's side (torch on
CUDA: `Guide.allowed_later`); on the engine's thread, where the step's decode goes out alone and
its draw after (JAX: `Engine._draw_after`).
"""

from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from linnet.serve.request import RequestError

KINDS = ("json", "regex", "choice", "grammar")
# JSON laid out as json.dumps does, with no other whitespace: a model let to put whitespace
# anywhere can spend its tokens on newlines without end.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# compiled grammars a Guide keeps, the least recently asked dropped first (an app sends the same
# schema again and again; a body's n choices share one)
COMPILED_KEPT = 64


@dataclass(frozen=True)
class Structure:
    """What a request's output must be.

    kind "json": `spec` is a JSON schema (a dict, or its text; {"type": "object"} for any object);
    "regex": a regular expression the whole output matches; "choice": a list of strings, one of
    which is the output; "grammar": a Lark grammar (llguidance's dialect), or llama.cpp's GBNF.
    """

    kind: str
    spec: object

    def grammar(self) -> str:
        """llguidance's grammar for it; ValueError where the spec cannot be one."""
        import llguidance

        if self.kind not in KINDS:
            raise ValueError(f"structure kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "choice":
            if not isinstance(self.spec, list) or not self.spec or not all(isinstance(s, str) and s for s in self.spec):
                raise ValueError("a choice must be a non-empty list of non-empty strings")
            # its strings are a row of alternatives, n strings n + 1 items, which llguidance's parser
            # refuses past its limit at the first draw, after compiling it (300,000: 229 s, on the host)
            most = llguidance.LLParserLimits().max_items_in_row - 1
            if len(self.spec) > most:
                raise ValueError(f"a choice may hold at most {most} strings (llguidance's parser's limit on "
                                 f"alternatives), not {len(self.spec)}")
            return llguidance.grammar_from("choice", self.spec)
        if self.kind == "json":
            try:
                schema = json.loads(self.spec) if isinstance(self.spec, str) else self.spec
                if not isinstance(schema, dict):
                    raise ValueError("a JSON schema must be an object")
                return llguidance.LLMatcher.grammar_from_json_schema(closed_objects(schema), defaults=JSON_LAYOUT)
            except RecursionError:  # (read and copied by recursion, as llguidance's own reader refuses it)
                raise ValueError("the JSON schema is nested too deeply to be read") from None
        if not isinstance(self.spec, str) or not self.spec:
            raise ValueError(f"a {self.kind} must be a non-empty string")
        if self.kind == "regex" and (len(self.spec) - len(self.spec.rstrip("\\"))) % 2:
            # (llguidance reads the lone backslash as itself; Python's re and vLLM's refuse it)
            raise ValueError("the regex ends with a lone backslash: it escapes nothing")
        return llguidance.grammar_from("regex" if self.kind == "regex" else "grammar", self.spec)

    def problem(self) -> str | None:
        """Why no output could be held to it (a regex that does not parse, a schema llguidance
        cannot follow), found without a tokenizer: None where it can be used."""
        import llguidance

        try:
            error = llguidance.LLMatcher.validate_grammar(self.grammar())
        except (ValueError, TypeError) as err:
            return str(err)
        return readable_error(self.kind, error) if error else None


def closed_objects(schema: dict) -> dict:
    """`schema` (a copy), each object that lists its properties and says nothing of others taking no
    others, as xgrammar's strict mode (vLLM's default) and llama.cpp's grammars read a schema: held to
    the letter of JSON Schema, where such an object may hold any other key, a model spends its tokens
    on keys nobody asked for. Left as written: where the schema says (additionalProperties,
    unevaluatedProperties), and what combines with other schemas (allOf's several branches, not,
    if / then / else, a $ref beside properties, and the $defs of a schema that has such; an object
    whose anyOf or oneOf branches, or $ref, may list more properties), where closing one would refuse
    the others' properties."""
    schema = copy.deepcopy(schema)
    combines = _combines(schema)

    def close(node):
        if isinstance(node, list):
            for item in node:
                close(item)
            return
        if not isinstance(node, dict):
            return
        listed = "properties" in node or "patternProperties" in node
        # an object's properties beside branches that may list more (anyOf, oneOf, dependencies) join theirs
        joined = listed and any(key in node for key in ("anyOf", "oneOf", "allOf", "$ref", "dependentSchemas",
                                                        "dependencies"))
        if listed and not joined and "additionalProperties" not in node and "unevaluatedProperties" not in node:
            node["additionalProperties"] = False
        for key in ("properties", "patternProperties") + (("$defs", "definitions") if not combines else ()):
            if isinstance(node.get(key), dict):
                for sub in node[key].values():
                    close(sub)
        for key in ("additionalProperties", "items", "prefixItems") + (("anyOf", "oneOf") if not joined else ()):
            close(node.get(key))
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1:
            close(node["allOf"])

    close(schema)
    return schema


def _combines(node) -> bool:
    """Whether a schema anywhere combines schemas whose properties join (allOf of several, not, if, a
    $ref beside properties of its own)."""
    if isinstance(node, list):
        return any(_combines(item) for item in node)
    if not isinstance(node, dict):
        return False
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1 or "not" in node or "if" in node:
        return True
    if "$ref" in node and ("properties" in node or "patternProperties" in node):
        return True
    return any(_combines(value) for value in node.values())


def readable_error(kind: str, error: str) -> str:
    """llguidance's error for a structure of `kind`, without the grammar it wrapped a regex, a
    schema or a choice in (the user wrote none): a grammar's own lines are kept. Its matcher's
    state and grammar, which llguidance dumps after an error met while drawing, are left out."""
    error = error.split("\n<state>")[0]
    if kind != "grammar":
        error = error.split("\n   1 | ")[0]  # the wrapping grammar, echoed with a caret
        if error.startswith("at ") and "): " in error:
            error = error.split("): ", 1)[1]  # its line and column
    return error.rstrip()


class Guide:
    """llguidance over one model's tokenizer: a matcher per structured request."""

    def __init__(self, tokenizer, vocab: int, eos_token_ids: list):
        import llguidance

        if not eos_token_ids:
            raise RequestError("structured outputs need the tokenizer's end token, and it has none", "structure")
        # The tokenizer's JSON, as llguidance reads it; ids past the tokenizer's (padding) are never allowed.
        try:
            self.tokenizer = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab,
                                                    eos_token=list(eos_token_ids))
        except ValueError as err:  # a tokenizer whose tokens' bytes it cannot tell (one with no decoder)
            raise RequestError(f"structured outputs cannot read this tokenizer's tokens as bytes: {err}",
                               "structure") from None
        self.vocab = vocab
        self.executor = llguidance.LLExecutor()  # computes many requests' masks at once, on threads of its own
        self._asker = None  # the thread that waits on the executor for `allowed_later`, made at its first use
        self._compiled: OrderedDict = OrderedDict()  # grammar -> a matcher that takes no token: each request's is a copy
        self._compiled_lock = threading.Lock()  # (requests are submitted on several threads: the server's)

    def matcher(self, structure: Structure, request_id: str):
        """A matcher for one request; RequestError if its structure is not a valid one. A grammar
        asked before is not compiled again: the request's matcher is a copy of the one compiled
        then, which shares what it has learnt of the grammar's tokens (a JSON schema: 10 ms to
        compile on this CPU, its copy 0.01 ms, and the copy's first mask 0.1 ms, not 2)."""
        import llguidance

        try:
            grammar = structure.grammar()
        except (ValueError, TypeError) as err:
            raise RequestError(f"{request_id}: {err}", "structure") from None
        with self._compiled_lock:
            compiled = self._compiled.get(grammar)
            if compiled is not None:
                self._compiled.move_to_end(grammar)
                return compiled.deep_copy()
        compiled = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if compiled.is_error():
            raise RequestError(f"{request_id}: the {structure.kind} cannot be used: "
                               f"{readable_error(structure.kind, compiled.get_error())}", "structure")
        # Its first mask, made here for its copies to share: a structure that no text matches (a regex
        # of `[^\s\S]`) errs there, where it would allow nothing but the end token, and end the output
        # empty, as if it were complete (one stuck later ends with an error: `Engine._finished`).
        self.allowed([compiled])
        if compiled.is_error():
            raise RequestError(f"{request_id}: no text this model can write matches the {structure.kind} "
                               f"({readable_error(structure.kind, compiled.get_error())})", "structure")
        with self._compiled_lock:
            self._compiled[grammar] = compiled
            while len(self._compiled) > COMPILED_KEPT:
                self._compiled.popitem(last=False)
            return compiled.deep_copy()

    def allowed(self, matchers: list) -> np.ndarray:
        """The tokens each matcher takes next, packed: int32[len(matchers), (vocab + 31) // 32], bit j
        of word w for token 32 w + j. Sent so and unpacked on the device: a bool row of a 128k
        vocabulary per request each step would be the host's slowest work."""
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask_par

        masks = allocate_token_bitmask(len(matchers), self.vocab)
        fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], masks)
        return masks

    def allowed_later(self, matchers: list) -> Future:
        """`allowed(matchers)`, computed while the caller goes on (llguidance lets go of the GIL):
        the masks of a step's draw, made while the model's step runs. Until the result is read,
        nothing else may use these matchers (llguidance refuses a matcher in use)."""
        if self._asker is None:
            self._asker = ThreadPoolExecutor(1, thread_name_prefix="linnet-masks")
        return self._asker.submit(self.allowed, matchers)
