"""Structured outputs through the engine, on a random tiny model whose tokens are single bytes
(a byte-level BPE with no merges): whatever the model would say, each output parses as its
structure asks, checked by an independent reader (json, re); the requests beside them draw as they
would alone."""

import json
import re

import numpy as np
import pytest

from linnet.serve import Engine, Request, RequestError
from linnet.serve.structured import Structure

from .test_engine import prompts, reference_greedy
from .test_sampling import race

pytest.importorskip("llguidance")

EOS = 0


def byte_tokenizer(vocab: int, more: bytes = b""):
    """Token 0 ends; tokens 1.. are newline and the printable ASCII bytes, then the bytes `more`,
    GPT-2's byte-level spelling."""
    from tokenizers import AddedToken, Tokenizer as Backend, decoders, models, pre_tokenizers

    from linnet.nest.tokenizer import Tokenizer

    shown = [*range(33, 127), *range(161, 173), *range(174, 256)]  # GPT-2 spells these bytes as themselves,
    unshown = [b for b in range(256) if b not in shown]  # and the others as 256, 257, ... in order
    spell = lambda b: chr(b) if b in shown else chr(256 + unshown.index(b))
    table = {"<eos>": EOS, **{spell(b): i + 1 for i, b in enumerate([10] + list(range(32, 127)) + list(more))}}
    assert len(table) <= vocab
    backend = Backend(models.BPE(vocab=table, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken("<eos>", special=True)])
    return Tokenizer(backend, eos_token_ids=[EOS])


@pytest.fixture
def engine(model):
    model.tokenizer = byte_tokenizer(model.vocab)
    try:
        yield Engine(model, token_budget=128)
    finally:
        model.tokenizer = None


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "n", "ok"],
          "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "minimum": 0,
                                                                           "maximum": 999},
                         "ok": {"type": "boolean"}}}


def test_each_output_is_what_its_structure_asks_and_the_others_draw_as_alone(engine, model):
    p = prompts(6, 3, 12, seed=31)
    structures = [Structure("json", SCHEMA), Structure("regex", r"(yes|no), [0-9]{3}"),
                  Structure("choice", ["red", "green", "blue"]), Structure("grammar", 'start: ("x" | "y")+ "!"'),
                  Structure("grammar", 'root ::= "ok" | "no" "pe"'), Structure("json", {"type": "object"})]
    structured = [Request(prompt=q, max_new_tokens=48, temperature=1.0, seed=i, structure=s)
                  for i, (q, s) in enumerate(zip(p, structures))]
    plain = [Request(prompt=q, max_new_tokens=8) for q in p[:3]]
    done, _ = engine.run(structured + plain)
    texts = [c.text for c in done[:len(structured)]]
    value = json.loads(texts[0])
    assert set(value) == {"name", "n", "ok"} and isinstance(value["name"], str) and len(value["name"]) <= 6
    assert isinstance(value["n"], int) and 0 <= value["n"] <= 999 and isinstance(value["ok"], bool)
    assert re.fullmatch(r"(yes|no), [0-9]{3}", texts[1])
    assert texts[2] in ("red", "green", "blue")
    assert re.fullmatch(r"[xy]+!", texts[3]) or done[3].finish_reason == "length"
    assert texts[4] in ("ok", "nope")
    assert done[5].finish_reason == "length" or isinstance(json.loads(texts[5]), dict)
    assert texts[5].startswith("{")
    for i in (0, 1, 2, 4):  # bounded structures end when complete, not at the token limit
        assert done[i].finish_reason == "stop" and EOS not in done[i].tokens[:-1]
    for q, c in zip(p, done[len(structured):]):
        assert c.tokens == reference_greedy(model, q, 8)


def structured_greedy(model, prompt, structure, new, pad_to=128, temperature=0.0, seed=0):
    """Greedy tokens held to `structure` with no engine: the model's logits for row 0, step by step
    (`reference_greedy`'s passes), each masked by llguidance's own numpy code from a matcher of its
    own over the model's tokenizer; until the end token, a complete output or `new` tokens. With a
    temperature, seeded draws instead: the exponential race over the masked logits with the
    samplers' noise, written out in numpy (`test_sampling.race`)."""
    import llguidance
    from llguidance.numpy import allocate_token_bitmask, apply_token_bitmask_inplace, fill_next_token_bitmask

    matcher = llguidance.LLMatcher(llguidance.LLTokenizer(model.tokenizer.backend.to_str(), n_vocab=model.vocab,
                                                          eos_token=[EOS]), structure.grammar())
    bits = allocate_token_bitmask(1, model.vocab)

    def draw(logits) -> int:
        fill_next_token_bitmask(matcher, bits)
        row = np.array(np.asarray(logits)[:1], np.float32)
        apply_token_bitmask_inplace(row, bits)
        token = race(row[0], temperature, seed, len(out))
        assert matcher.consume_token(token), matcher.get_error()
        return token

    out = []
    model.reset()
    n = len(prompt)
    pad = pad_to - n
    positions = np.concatenate([np.arange(n), np.full(pad, model.max_seq - 1)]).astype(np.int32)
    rows = np.concatenate([np.zeros(n), np.ones(pad)]).astype(np.int32)
    out.append(draw(model.prefill(np.array(prompt + [0] * pad, np.int32), positions, rows,
                                  np.array([n - 1], np.int32))))
    tokens, positions = np.zeros(model.batch, np.int32), np.full(model.batch, model.max_seq - 1, np.int32)
    while len(out) < new and out[-1] != EOS and not matcher.is_stopped():
        tokens[0], positions[0] = out[-1], n + len(out) - 1
        out.append(draw(model.decode(tokens, positions)))
    model.reset()
    return out


@pytest.mark.parametrize("during", [False, True], ids=["masks-first", "masks-during-the-step"])
def test_greedy_structured_tokens_are_those_llguidance_masks_give_step_by_step(engine, model, during):
    """The engine's greedy draws under a JSON schema, a regex and a choice, side by side in one
    batch, against a plain loop applying llguidance's mask to the model's logits; each text parses
    as its structure asks. The masks made before each step is sent, or on a thread while it runs
    (as torch on CUDA has them; JAX's step takes them as it is sent, either way)."""
    engine.runner.masks_during_the_step = during
    engine.runner.draws_apart = engine.runner.draws_apart and during  # JAX: the decode ahead alone, or not
    structures = [Structure("json", SCHEMA), Structure("regex", r"[a-z]{2,5}( [a-z]{2,5}){1,3}\."),
                  Structure("choice", ["alpha", "beta", "gamma"]), Structure("json", {"type": "object"})]
    p = prompts(len(structures), 3, 12, seed=57)
    done, _ = engine.run([Request(prompt=q, max_new_tokens=40, structure=s) for q, s in zip(p, structures)]
                         + [Request(prompt=p[0], max_new_tokens=8)])
    for q, s, c in zip(p, structures, done):
        assert c.tokens == structured_greedy(model, q, s, 40), s
    assert [c.finish_reason for c in done[:3]] == ["stop"] * 3  # each complete, well before the limit
    value = json.loads(done[0].text)
    assert set(value) == {"name", "n", "ok"} and isinstance(value["name"], str) and len(value["name"]) <= 6
    assert isinstance(value["n"], int) and 0 <= value["n"] <= 999 and isinstance(value["ok"], bool)
    assert re.fullmatch(r"[a-z]{2,5}( [a-z]{2,5}){1,3}\.", done[1].text)
    assert done[2].text in ("alpha", "beta", "gamma")
    assert done[3].finish_reason == "length" or isinstance(json.loads(done[3].text), dict)
    assert done[4].tokens == reference_greedy(model, p[0], 8)


@pytest.mark.parametrize("schema, text, taken", [
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a": 1, "b": 2}', False),  # no key unasked for
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a": 1}', True),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True}, '{"a": 1, "b": 2}', True),
    ({"type": "object"}, '{"b": 2}', True),  # (json_object's: any object)
    # nested, in a list, and a property that is named "properties"
    ({"type": "array", "items": {"type": "object", "properties": {"properties": {"type": "object",
                                                                                 "properties": {}}}}},
     '[{"properties": {}}]', True),
    ({"type": "array", "items": {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}},
     '[{"a": {"z": 1}}]', False),
    ({"$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}}, "$ref": "#/$defs/P"},
     '{"x": 1, "y": 2}', False),
    # branches whose properties join are left as written: closing each would refuse the other's
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                {"type": "object", "properties": {"b": {"type": "integer"}}}]}, '{"a": 1, "b": 2}', True),
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "anyOf": [{"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}, '{"a": 1, "b": 2}', True),
    # a $ref beside properties: both hold, so neither the object nor the one it refers to is closed
    ({"$defs": {"B": {"type": "object", "properties": {"x": {"type": "integer"}}}}, "$ref": "#/$defs/B",
      "properties": {"y": {"type": "integer"}}}, '{"x": 1, "y": 2}', True),
])
def test_an_object_that_lists_its_properties_takes_no_others_as_vllm_and_llama_cpp_hold_it(schema, text, taken):
    """As xgrammar's strict mode (vLLM's default) and llama.cpp's grammars read a schema, an object
    listing its properties and saying nothing of others takes no others; one that says so takes them."""
    from linnet.serve.structured import Guide

    tokenizer, asked = byte_tokenizer(128), json.dumps(schema)
    matcher = Guide(tokenizer, 128, [EOS]).matcher(Structure("json", schema), "r")
    read = matcher.consume_tokens(tokenizer.encode(text, False)) and not matcher.is_error()
    assert (read and matcher.is_accepting()) == taken
    assert json.dumps(schema) == asked  # the request's own schema is left as it was


def test_requests_of_one_structure_share_its_compiling_and_draw_each_as_alone(engine, model):
    """Requests that ask the same structure (a body's n choices, an app's one schema), in one batch and
    again in a later run, take copies of the grammar compiled once, each following its own tokens:
    every one draws what llguidance's masks give it alone, step by step."""
    p = prompts(3, 3, 12, seed=59)
    schema = Structure("json", SCHEMA)
    for _ in range(2):
        done, _ = engine.run([Request(prompt=q, max_new_tokens=40, structure=schema) for q in p])
        for q, c in zip(p, done):
            assert c.tokens == structured_greedy(model, q, schema, 40)
            assert c.finish_reason == "stop" and set(json.loads(c.text)) == {"name", "n", "ok"}
    assert len(engine.guide()._compiled) == 1


@pytest.mark.parametrize("during", [False, True], ids=["masks-first", "masks-during-the-step"])
def test_seeded_structured_tokens_are_the_race_over_llguidances_masked_logits(engine, model, during):
    """Seeded draws under a JSON schema and a regex, beside a greedy one, against the plain loop with
    numpy's exponential race over each step's masked logits; under JAX, masks during the step send
    the model's decode alone and draw after it in an executable of their own (the same tokens as
    the draw inside the step's)."""
    engine.runner.masks_during_the_step = during
    engine.runner.draws_apart = engine.runner.draws_apart and during  # JAX: the decode ahead alone, or not
    structures = [Structure("json", SCHEMA), Structure("regex", r"[a-z]{2,5}( [a-z]{2,5}){1,3}\."),
                  Structure("json", {"type": "object"})]
    p = prompts(len(structures), 3, 12, seed=61)
    temperatures, seeds = [1.0, 0.8, 0.0], [11, 2**31 + 3, 0]
    done, _ = engine.run([Request(prompt=q, max_new_tokens=32, structure=s, temperature=t, seed=seed)
                          for q, s, t, seed in zip(p, structures, temperatures, seeds)])
    for q, s, t, seed, c in zip(p, structures, temperatures, seeds, done):
        assert c.tokens == structured_greedy(model, q, s, 32, temperature=t, seed=seed), s
    assert re.fullmatch(r"[a-z]{2,5}( [a-z]{2,5}){1,3}\.", done[1].text)
    assert len(set(done[0].tokens)) > 3  # draws, not one token


def test_a_warmed_up_engine_compiles_nothing_for_structured_requests(engine, model):
    """A server's warmup (masks, penalties, logprobs) covers structured requests' steps, greedy and
    seeded, beside penalized and free ones, with masks made first or during the step (JAX: the
    decode alone and its draw apart): no compile after it; either way, the same tokens."""
    engine.warmup(logprobs=True, structured=True, adjusted=True)
    p = prompts(4, 3, 12, seed=67)
    asks = [{"structure": Structure("json", SCHEMA), "temperature": 0.9, "seed": 4, "logprobs": 2},
            {"structure": Structure("regex", r"[a-z]{2,5}( [a-z]{2,5}){1,3}\.")},
            {"structure": Structure("json", {"type": "object"}), "presence_penalty": 0.5, "logit_bias": {5: 1.0}},
            {"repetition_penalty": 1.3, "temperature": 0.7, "seed": 8}]
    runs, apart = [], engine.runner.draws_apart
    for during in (False, True):  # JAX: the decode ahead alone and the masks during it, or neither
        engine.runner.masks_during_the_step, engine.runner.draws_apart = during, apart and during
        done, stats = engine.run([Request(prompt=q, max_new_tokens=24, **ask) for q, ask in zip(p, asks)])
        assert stats.compiles == 0, (during, stats.compiled)
        assert all(c.finish_reason in ("stop", "length") for c in done), [c.error for c in done]
        runs.append([c.tokens for c in done])
    assert runs[0] == runs[1]


def test_a_step_that_fails_while_its_masks_are_made_leaves_the_matchers_free(engine, model):
    """A decode step that raises (the device gone: put in by hand, nothing here fails so on its
    own) while its structures' masks are made on a thread: the engine's error comes out, and the
    thread has let go of the matchers by then (llguidance refuses a matcher in use)."""
    if not hasattr(engine.runner, "decode"):
        pytest.skip("the torch runner's decode step")
    engine.runner.masks_during_the_step = True
    engine.submit(Request(prompt=[5, 6, 7], max_new_tokens=8, structure=Structure("json", SCHEMA)))
    engine.step()  # the prefill, and its draw

    def gone(tokens, positions):
        raise RuntimeError("the device went away")
    engine.runner.decode = gone
    with pytest.raises(RuntimeError, match="went away"):
        engine.step()
    matcher = engine.live[0].matcher
    assert engine.guide().allowed([matcher]).any() and not matcher.is_error()


def test_a_structure_that_must_end_ends_the_request_before_min_tokens(engine):
    """min_tokens keeps the end token out, but a structure that is complete and allows nothing more
    ends the request there, its text whole; allowed tokens that all end the request, with
    min_tokens, are a contradiction refused at submission."""
    done, _ = engine.run([Request(prompt=[5, 6], max_new_tokens=12, min_tokens=8, structure=Structure("regex", "ab"))])
    assert done[0].text == "ab" and done[0].finish_reason == "stop"
    with pytest.raises(RequestError, match="nothing could be drawn"):
        engine.submit(Request(prompt=[5], max_new_tokens=4, min_tokens=2, stop_token_ids=[7], allowed_token_ids=[7]))



def test_allowed_token_ids_that_leave_a_structure_no_token_end_it_with_an_error(engine, model):
    """allowed_token_ids and a structure both hold a draw; where no token is in both, nothing may be
    drawn. A structure no allowed token can begin is refused at submission; one they leave
    partway ("n" of "yes|no", and "o" not allowed) ends its request with an error there, the
    others running on. Each had drawn the argmax of logits all -inf: token 0, the end token, a
    "stop" with no text, as if the structure had been met."""
    ids = lambda text: engine.tokenizer.encode(text, add_special_tokens=False)
    yes_no = Structure("regex", "yes|no")
    assert not any(re.fullmatch("yes|no", c + d) for c in "n" for d in "n")  # "n" cannot follow "n"
    with pytest.raises(RequestError, match="no token of allowed_token_ids can begin the structure"):
        engine.submit(Request(prompt=[5], max_new_tokens=4, structure=yes_no, allowed_token_ids=ids("abc")))
    cornered = Request(prompt=[5, 6], max_new_tokens=6, structure=yes_no, allowed_token_ids=ids("n"), temperature=1.0)
    done, _ = engine.run([cornered, Request(prompt=[7, 8], max_new_tokens=6)])
    assert done[0].finish_reason == "error" and done[0].tokens == ids("n")
    assert "fits the structure after 1 token" in done[0].error and done[0].error_field == "allowed_token_ids"
    assert done[1].finish_reason == "length" and done[1].tokens == reference_greedy(model, [7, 8], 6)

def test_a_structure_with_the_same_seed_draws_the_same_whatever_shares_the_batch(engine):
    req = lambda: Request(prompt=[5, 6, 7], max_new_tokens=40, temperature=1.0, seed=3, structure=Structure("json", SCHEMA))
    alone, _ = engine.run([req()])
    crowded, _ = engine.run([Request(prompt=q, max_new_tokens=12, temperature=0.7, seed=9) for q in prompts(5, 2, 9)] +
                            [req()])
    assert crowded[-1].tokens == alone[0].tokens and crowded[-1].text == alone[0].text


def nested(schema: dict, depth: int) -> dict:
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("structure,needle", [
    (Structure("regex", "(unclosed"), "cannot be used"),
    (Structure("json", ["not", "a", "schema"]), "JSON schema"),
    (Structure("choice", []), "choice"),
    (Structure("choice", [f"c{i}" for i in range(2000)]), "at most 1999 strings"),
    (Structure("grammar", "start: undefined_rule"), "cannot be used"),
    (Structure("yaml", "a: b"), "kind"),
    (Structure("regex", "abc\\"), "lone backslash"),  # (Python's re refuses it too)
    (Structure("json", nested({"type": "integer"}, 3000)), "nested too deeply"),
])
def test_a_bad_structure_is_refused_at_submission(engine, structure, needle):
    with pytest.raises(RequestError, match=needle) as err:
        engine.submit(Request(prompt=[1, 2], max_new_tokens=4, structure=structure))
    assert structure.kind == "grammar" or "start:" not in str(err.value)  # not the grammar llguidance wrapped it in
    assert structure.problem() is not None  # found without the tokenizer too
    done, _ = engine.run([Request(prompt=[1, 2], max_new_tokens=4, structure=structure),
                          Request(prompt=[1, 2], max_new_tokens=4)])
    assert done[0].finish_reason == "error" and done[1].finish_reason == "length"


def test_a_structure_no_text_matches_is_refused_or_ends_its_request_with_an_error(engine, model):
    """A regex no text matches allowed nothing but the end token, whose draw ended the output empty
    with a "stop", as if it were complete: it is refused at submission (with a tokenizer: its
    matcher finds it in its first mask). A grammar that lets one token be drawn and then nothing
    ends its request with an error there, the others running on."""
    assert re.fullmatch(r"[^\s\S]", "") is None
    with pytest.raises(RequestError, match="no text this model can write matches the regex"):
        engine.submit(Request(prompt=[1, 2], max_new_tokens=4, structure=Structure("regex", r"[^\s\S]")))
    stuck = Structure("grammar", 'start: "x" /[^\\s\\S]/')
    done, _ = engine.run([Request(prompt=[5, 6], max_new_tokens=6, structure=stuck), Request(prompt=[7, 8], max_new_tokens=6)])
    assert done[0].finish_reason == "error" and done[0].text == "x" and done[0].error_field == "structure"
    assert "after 1 token no text could follow that the grammar matches" in done[0].error
    assert done[1].finish_reason == "length" and done[1].tokens == reference_greedy(model, [7, 8], 6)


def test_an_error_a_matcher_meets_while_drawing_is_told_without_its_state():
    """llguidance's error for a matcher that meets one after some tokens ends with a dump of its
    state and grammar (kilobytes): the request's error is its first line."""
    from linnet.serve.structured import Guide, readable_error

    tokenizer = byte_tokenizer(128)
    guide = Guide(tokenizer, 128, [EOS])
    matcher = guide.matcher(Structure("grammar", 'start: "x" /[^\\s\\S]/'), "r")
    assert matcher.consume_tokens(tokenizer.encode("x", False))
    guide.allowed([matcher])
    assert matcher.is_error() and "<state>" in matcher.get_error()
    assert readable_error("grammar", matcher.get_error()) == matcher.get_error().split("\n")[0]


def test_a_choice_of_as_many_strings_as_llguidances_parser_takes_is_drawn_from(engine):
    """A choice of n strings is a row of n + 1 alternatives to llguidance's parser, which takes at
    most max_items_in_row (2000) of them: 1,999 strings are drawn from; one more is refused at
    submission (above), where it was compiled only to fail at its first draw."""
    import llguidance

    most = llguidance.LLParserLimits().max_items_in_row - 1
    strings = [f"c{i}" for i in range(most)]
    done, _ = engine.run([Request(prompt=[1, 2], max_new_tokens=8, structure=Structure("choice", strings))])
    assert done[0].finish_reason == "stop" and done[0].text in strings, (done[0].finish_reason, done[0].error)


def test_without_a_tokenizer_a_structure_is_refused(model):
    with pytest.raises(RequestError, match="tokenizer"):
        Engine(model).submit(Request(prompt=[1], max_new_tokens=2, structure=Structure("regex", "a")))


@pytest.mark.parametrize("sequence", [list, tuple])
def test_a_structure_after_a_marker_leaves_the_thinking_before_it_free(engine, model, sequence):
    """A reasoning model thinks freely, then answers as asked: the structure holds only after
    `structure_after` is drawn. The marker here is two tokens the model draws anyway (greedy, from
    its run without a structure), so the run is its own up to them, and digits after. The marker
    as a tuple is the same marker."""
    for seed in range(41, 80):  # a prompt whose greedy run first draws its 3rd and 4th tokens as a pair there
        p = prompts(1, 5, 5, seed=seed)[0]
        free = reference_greedy(model, p, 6)
        if EOS not in free[:4] and len(set(free[:4])) == 4:
            break
    req = Request(prompt=p, max_new_tokens=20, structure=Structure("regex", "[0-9]{3}"),
                  structure_after=sequence(free[2:4]))
    done, _ = engine.run([req])
    assert done[0].tokens[:4] == free[:4]
    assert re.fullmatch(r"[0-9]{3}", model.tokenizer.decode(done[0].tokens[4:])) and done[0].finish_reason == "stop"
    never = Request(prompt=p, max_new_tokens=6, structure=Structure("regex", "[0-9]{3}"), structure_after=[EOS, EOS])
    assert engine.run([never])[0][0].tokens == free  # never drawn: never held


@pytest.mark.parametrize("cut, text", [(1, ""), (2, "é"), (3, "é"), (5, "é")])
def test_a_reply_cut_inside_a_character_ends_before_it(model, cut, text):
    """max_tokens stopping partway through a character's bytes: the text ends at the last whole
    character (vLLM's), streamed or not, never in U+FFFD."""
    from linnet.serve.openai_replies import TextStream

    model.tokenizer = byte_tokenizer(model.vocab, more="é🫠".encode())
    try:
        engine = Engine(model, token_budget=128)
        comp = engine.run([Request(prompt=[5, 6], max_new_tokens=cut, structure=Structure("regex", "é🫠"))])[0][0]
        assert model.tokenizer.decode(comp.tokens) == "é🫠".encode()[:cut].decode(errors="replace")
        assert comp.text == text and comp.finish_reason == "length"
        stream = TextStream(model.tokenizer, context=[5, 6])
        assert "".join(stream.push([t]) for t in comp.tokens) + stream.finish(None) == text
    finally:
        model.tokenizer = None


def test_a_tokenizer_llguidance_cannot_read_fails_structured_requests_alone():
    """A word-level tokenizer with no decoder: llguidance cannot tell its tokens' bytes. A structured
    request gets a RequestError that says so (the server's 400 on response_format; it was an
    internal error, a 500), and a plain request on the same engine still runs."""
    from .conftest import make_model
    from .test_engine import word_tokenizer

    model = make_model("torch", rows=2, max_seq=32)
    model.tokenizer = word_tokenizer(model.vocab)
    model.tokenizer.eos_token_ids = [1]
    engine = Engine(model)
    with pytest.raises(RequestError, match="cannot read this tokenizer's tokens as bytes") as err:
        engine.submit(Request(prompt=[5, 6], max_new_tokens=4, structure=Structure("regex", "t3")))
    assert err.value.field == "structure"
    done, _ = engine.run([Request(prompt=[5, 6], max_new_tokens=4)])
    assert done[0].tokens == reference_greedy(model, [5, 6], 4, pad_to=None)
