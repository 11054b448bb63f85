"""A stream of tool calls as a client puts it together, for the tests of the readers that make it."""

from linnet.serve.tool_stream import CallStream


def stream(parser, reply: str, names: set, step: int = 1) -> list:
    """The tool calls a client puts together from a stream of `reply` read a few characters at a
    time by `parser.partial` (the rest of each call sent at the end, from `parse`): [(id, name,
    arguments)]."""
    out, ids = [], iter(range(10**6))
    calls = CallStream(lambda: f"call_{next(ids)}", frozenset(names))
    for end in list(range(0, len(reply), step)) + [len(reply)]:
        for event in calls.news(parser.partial(reply[:end])):
            out.append(event)
    _, made = parser.parse(reply)
    out += calls.finish([{"id": f"end_{k}", "type": "function", "function": dict(c)} for k, c in enumerate(made)])
    got: list = []
    for kind, k, value in out:
        if kind == "open":
            assert k == len(got) and value["function"]["arguments"] == ""
            got.append([value["id"], value["function"]["name"], ""])
        else:
            got[k][2] += value
    return [tuple(c) for c in got]
