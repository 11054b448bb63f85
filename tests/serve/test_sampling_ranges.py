"""One range per sampling field (`SAMPLING_RANGES`), and every door agrees on it: a request body on
the server, a `Request` the engine validates, a model's generation config, and the CLI's flags each
take a field's bounds and refuse a value just past either. (They were four tables once, and a
generation config could set a default that every request leaving the field out was refused for.)"""

import argparse

import pytest

from linnet import cli
from linnet.nest.tokenizer import sampling_problem
from linnet.serve.openai_api import ApiError, sampling_request
from linnet.serve.request import SAMPLING_RANGES, Request, RequestError

VOCAB, MAX_SEQ = 64, 32
CLI_FLAGS = {"temperature": cli._temperature, "top_p": cli._top_p, "min_p": cli._min_p,
             "repetition_penalty": cli._penalty}
CASES = [(name, bound, side) for name, (least, most, _) in SAMPLING_RANGES.items()
         for bound, side in ((least, -1), (most, 1)) if bound is not None]


def past(bound, side):
    """A value just past `bound` on `side` (-1: below, 1: above)."""
    return bound + side * max(abs(bound), 1e-3)


def server_request(name, value) -> Request:
    return sampling_request({name: value}, [1, 2], MAX_SEQ, 4)


@pytest.mark.parametrize("name, bound, side", CASES)
def test_a_bound_is_taken_everywhere(name, bound, side):
    request = server_request(name, bound)
    request.validate(VOCAB, MAX_SEQ)  # the engine runs what the server made
    if name != "top_k":  # (the engine's top_k is 0 for no limit; the server's -1 is mapped to it)
        Request(prompt=[1], max_new_tokens=1, **{name: bound}).validate(VOCAB, MAX_SEQ)
    if name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
        assert sampling_problem(name, bound) is None
    if name in CLI_FLAGS:
        assert CLI_FLAGS[name](repr(float(bound))) == bound


@pytest.mark.parametrize("name, bound, side", CASES)
def test_just_past_a_bound_is_refused_everywhere(name, bound, side):
    value = past(bound, side)
    with pytest.raises(ApiError) as err:
        server_request(name, value)
    assert err.value.status == 400 and err.value.body["error"]["param"] == name
    if name != "top_k":
        with pytest.raises(RequestError) as engine_err:
            Request(prompt=[1], max_new_tokens=1, **{name: value}).validate(VOCAB, MAX_SEQ)
        assert engine_err.value.field == name
    if name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
        assert sampling_problem(name, value) is not None
    if name in CLI_FLAGS:
        with pytest.raises(argparse.ArgumentTypeError, match="must be from"):
            CLI_FLAGS[name](repr(float(value)))


def test_top_k_takes_whole_numbers_only():
    with pytest.raises(ApiError, match="'top_k' must be an integer"):
        server_request("top_k", 2.5)
    assert sampling_problem("top_k", 2.5) == "a whole number"
    assert server_request("top_k", -1).top_k == 0  # vLLM's "no limit"
