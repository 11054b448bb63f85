"""A chat template a client sent, rendered with its sizes bounded.

A server started with `--trust-request-chat-template` renders templates that
requests bring. Jinja's sandbox keeps them from Python's internals, not from
the machine: `{{ "x" * 10**10 }}` asks for 10 GB, `{{ 9**9**9 }}` for minutes
of one core. Here, in the environment transformers' own (`chat_template`), the
operations that make a big value at once are checked before they run, each
refusal naming what was asked: a range past `MAX_RANGE` items (Jinja's own
bound, given a message that names it), a string or list past `MAX_TEXT` from
`*` or `+`, an integer past `MAX_INT_BITS` from `*` or `**`, and the rendered
text past `MAX_TEXT` characters, counted as it is written. What no single
operation shows (loops nested deep, a macro's recursion, memory heaped up a
little at a time) is bounded by the process it runs in (`template_sandbox`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .chat_template import compiled, environment, template_variables

MAX_RANGE = 100_000     # items of one range(): Jinja's sandbox's bound
MAX_TEXT = 16 << 20     # characters of the rendered text, and items of a string or list made by * or +
MAX_INT_BITS = 1 << 16  # bits of an integer made by * or **


def _template_error():
    from jinja2.exceptions import TemplateError

    return TemplateError


class TemplateLimitError(Exception):
    """A request's template asked for more than a bound allows; the message names the bound."""


def _sized(value) -> bool:
    return isinstance(value, (str, list, tuple))


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_binop(operator: str, left, right) -> None:
    """Refuse `left operator right` where its result would pass a bound (before it is made)."""
    if operator == "*":
        if _sized(left) and _int(right) or _sized(right) and _int(left):
            seq, times = (left, right) if _sized(left) else (right, left)
            if len(seq) * max(times, 0) > MAX_TEXT:
                raise TemplateLimitError(f"'*' would make {len(seq) * times} items; at most {MAX_TEXT} "
                                         f"(a request's template's strings and lists)")
        elif _int(left) and _int(right) and abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
            raise TemplateLimitError(f"'*' would make an integer of more than {MAX_INT_BITS} bits")
    elif operator == "**":
        if _int(left) and _int(right) and abs(left) > 1 and right > 0 \
                and (abs(left).bit_length() - 1) * right > MAX_INT_BITS:
            raise TemplateLimitError(f"'**' would make an integer of more than {MAX_INT_BITS} bits")
    elif operator == "+" and _sized(left) and _sized(right) and len(left) + len(right) > MAX_TEXT:
        raise TemplateLimitError(f"'+' would make {len(left) + len(right)} items; at most {MAX_TEXT} "
                                 f"(a request's template's strings and lists)")


def _bounded_range(*args):
    items = range(*args)
    if len(items) > MAX_RANGE:
        raise TemplateLimitError(f"range() of {len(items)} items; at most {MAX_RANGE} in a request's template")
    return items


@lru_cache(maxsize=1)
def _environment():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+"})

        def call_binop(self, context, operator, left, right):
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

    env = environment(BoundedEnvironment)
    env.globals["range"] = _bounded_range
    return env


@lru_cache(maxsize=16)
def _compiled(source: str):
    return compiled(_environment(), source)


def render_bounded(source: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                   special_tokens: dict[str, str | None] | None = None, **extra: Any) -> str:
    """`source` rendered as `chat_template.render_chat_template` renders it, with the bounds above:
    a TemplateLimitError past one, a TokenizerError for a template that fails."""
    from .errors import TokenizerError

    template = _compiled(source)
    variables = template_variables(messages, add_generation_prompt, special_tokens, extra)
    pieces, length = [], 0
    try:
        for piece in template.generate(**variables):  # the text as it is written, so its length is known early
            length += len(piece)
            if length > MAX_TEXT:
                raise TemplateLimitError(f"the rendered text passed {MAX_TEXT} characters, the most a "
                                         f"request's template may write")
            pieces.append(piece)
    except _template_error() as e:
        raise TokenizerError(f"chat template: {e}") from None
    except OverflowError as e:  # a number too big for a float, a C size
        raise TokenizerError(f"chat template: {e}") from None
    return "".join(pieces)
