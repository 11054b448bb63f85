"""vLLM's bad_words: token sequences the output never completes. The engine's tokens against a
plain greedy loop over the model's own logits that bans, at each step, every token whose drawing
would make the output end with a bad word (checked by appending the token, not by the engine's
prefix test); and through the server, words spelled by its tokenizer."""
import json

import numpy as np
import pytest

from linnet.serve import Engine, Request, RequestError

from .test_engine import prompts, reference_greedy
from .test_server import call, engine_greedy, words


def ends_with_a_bad_word(output: list, bad_words: list) -> bool:
    return any(len(w) <= len(output) and output[len(output) - len(w):] == list(w) for w in bad_words)


def greedy_without(model, prompt, new, bad_words, pad_to=128):
    """`reference_greedy`'s loop, each step's argmax over the tokens that complete no bad word."""
    model.reset()
    n = len(prompt)
    pad = pad_to - n
    positions = np.concatenate([np.arange(n), np.full(pad, model.max_seq - 1)]).astype(np.int32)
    rows = np.concatenate([np.zeros(n), np.ones(pad)]).astype(np.int32)
    out = []

    def draw(logits):
        row = np.array(np.asarray(logits)[0], np.float64)
        for t in range(len(row)):
            if ends_with_a_bad_word(out + [t], bad_words):
                row[t] = -np.inf
        return int(row.argmax())
    out.append(draw(model.prefill(np.array(prompt + [0] * pad, np.int32), positions, rows,
                                  np.array([n - 1], np.int32))))
    tokens, positions = np.zeros(model.batch, np.int32), np.full(model.batch, model.max_seq - 1, np.int32)
    while len(out) < new:
        tokens[0], positions[0] = out[-1], n + len(out) - 1
        out.append(draw(model.decode(tokens, positions)))
    model.reset()
    return out


def contains(output: list, word: list) -> bool:
    return any(output[i:i + len(word)] == list(word) for i in range(len(output) - len(word) + 1))


def test_bad_words_are_never_completed_and_the_rest_draws_as_a_plain_loop(model):
    """Bad words of one, two and three tokens taken from the request's own greedy output (so each
    ban moves it), beside a plain request and a penalized one: each output equals the loop's, no
    bad word appears in it, and the plain request draws as alone. Steps run ahead where the runner
    can (JAX), which a ban following the output must not."""
    p = prompts(3, 6, 14, seed=91)
    free = reference_greedy(model, p[0], 16)
    bad = [[free[1]], free[4:6], free[8:11]]
    bad = [w for w in bad if w]
    asked = [Request(prompt=p[0], max_new_tokens=16, bad_words=bad),
             Request(prompt=p[1], max_new_tokens=16),
             Request(prompt=p[2], max_new_tokens=16, bad_words=[free[2:4]], repetition_penalty=1.0)]
    done, _ = Engine(model, token_budget=128).run(asked)
    assert done[0].tokens == greedy_without(model, p[0], 16, bad)
    assert done[0].tokens != free
    assert not any(contains(done[0].tokens, w) for w in bad)
    assert done[1].tokens == reference_greedy(model, p[1], 16)
    assert done[2].tokens == greedy_without(model, p[2], 16, [free[2:4]])


def test_a_bad_word_that_shares_its_start_with_the_output_bans_only_its_end(model):
    """A two-token bad word whose first token the output keeps drawing: only the token after it
    is banned, so the first token itself still comes (a ban of the whole word's tokens would
    remove it)."""
    p = prompts(1, 8, 8, seed=93)[0]
    free = reference_greedy(model, p, 12)
    word = [free[0], free[1]]
    done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=12, bad_words=[word])])
    assert done[0].tokens == greedy_without(model, p, 12, [word])
    assert done[0].tokens[0] == free[0] and done[0].tokens[1] != free[1]
    # a word ending in each token the output draws, after a token it never draws: it bans nothing
    never = next(t for t in range(model.vocab) if t not in free)
    done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=12, bad_words=[[never, t] for t in set(free)])])
    assert done[0].tokens == free


def test_bans_that_leave_no_token_are_refused_or_end_the_request_with_an_error(model):
    """Bans (bad_words, and min_tokens' end tokens) beside allowed_token_ids, or over the whole
    vocabulary, may leave a draw no token: it drew token 0 (an end token on most models), one that
    allowed_token_ids forbids, with no error. Where that holds from the first draw, the request is
    refused at submission; where it comes later (a two-token bad word), it ends with an error
    there, the request beside it drawing on."""
    p, engine = prompts(1, 8, 8, seed=95)[0], Engine(model)
    for fields in (dict(allowed_token_ids=[5], bad_words=[[5]]),
                   dict(allowed_token_ids=[5, 7], stop_token_ids=[7], min_tokens=2, bad_words=[[5]]),
                   dict(bad_words=[[t] for t in range(model.vocab)])):
        with pytest.raises(RequestError, match="banned from the first draw by bad_words") as err:
            engine.submit(Request(prompt=p, max_new_tokens=4, **fields))
        assert err.value.field == "bad_words"
    cornered = [Request(prompt=p, max_new_tokens=4, allowed_token_ids=[5], bad_words=[[5, 5]]),
                Request(prompt=p, max_new_tokens=4, allowed_token_ids=[5, 7], stop_token_ids=[7], min_tokens=3,
                        bad_words=[[5, 5]], temperature=1.0, seed=1),
                Request(prompt=p, max_new_tokens=4)]
    done, _ = engine.run(cornered)
    for c, why in zip(done, ["bad_words", "bad_words and min_tokens (its end tokens)"]):
        assert c.finish_reason == "error" and c.tokens == [5] and c.error_field == "bad_words"
        assert c.error.endswith(f"every token allowed_token_ids allows after 1 token is banned by {why}: nothing "
                                f"could be drawn")
    assert done[2].finish_reason == "length" and done[2].tokens == reference_greedy(model, p, 4)


@pytest.mark.parametrize("bad_words", [[[]], [[5, -1]], [["t5"]], [5], "t5", [[1.5]], [[True]]])
def test_malformed_bad_words_are_refused_naming_the_field(bad_words):
    with pytest.raises(RequestError) as err:
        Request(prompt=[1, 2, 3], max_new_tokens=4, bad_words=bad_words).validate(vocab=256, max_seq=32)
    assert err.value.field == "bad_words"


def test_the_server_spells_bad_words_with_its_tokenizer_and_refuses_malformed_ones(server):
    """A bad word given as text (the word tokenizer's `tN`) is banned wherever it would come next;
    a list that holds no strings is a 400 naming the field, as vLLM's schema refuses it."""
    base, engine, _ = server
    prompt = [11, 12, 13, 14]
    free = engine_greedy(engine, prompt, 8)
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "bad_words": [f"t{free[2]}", f" t{free[5]} "]}
    status, out = call(base, "/v1/completions", body)
    assert status == 200, out
    text = json.loads(out)["choices"][0]["text"].split()
    assert text[:2] == words(free[:2]) and f"t{free[2]}" not in text and f"t{free[5]}" not in text
    for wrong in ([1], "t5", [""], [" "]):
        status, out = call(base, "/v1/completions", dict(body, bad_words=wrong))
        assert status == 400 and json.loads(out)["error"]["param"] == "bad_words", out
    chat = {"messages": [{"role": "user", "content": "t5 t6"}], "max_tokens": 6, "temperature": 0}
    plain = json.loads(call(base, "/v1/chat/completions", chat)[1])["choices"][0]["message"]["content"].split()
    banned = plain[1]
    status, out = call(base, "/v1/chat/completions", dict(chat, bad_words=[banned]))
    assert status == 200, out
    reply = json.loads(out)["choices"][0]["message"]["content"].split()
    assert reply[0] == plain[0] and banned not in reply
