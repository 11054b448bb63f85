"""Render a model's Jinja chat template the way transformers does.

Templates come from model repositories, so they run in Jinja's immutable
sandbox. The environment matches transformers' so that templates written for
it render identically: trim_blocks and lstrip_blocks, the loopcontrols
extension ({% break %}/{% continue %}), a `tojson` filter that does not
HTML-escape, and the globals `raise_exception` and `strftime_now`. The
`{% generation %}` tag (transformers' assistant-mask marker) is accepted and
renders its body unchanged.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from typing import Any

from .errors import TokenizerError


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def environment(sandbox_class=None):
    """A Jinja environment as transformers' (`sandbox_class`: the sandbox it is made of, by default
    Jinja's immutable one; `bounded_template` gives one that also bounds sizes)."""
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    env = (sandbox_class or ImmutableSandboxedEnvironment)(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, Generation]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def compiled(env, source: str):
    """`source` compiled in `env`; a syntax error names its line."""
    import jinja2

    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TokenizerError(f"chat template, line {e.lineno}: {e.message}") from None


@lru_cache(maxsize=16)
def compile_template(source: str):
    """The compiled template (cached: one model keeps rendering the same one)."""
    return compiled(environment(), source)


@lru_cache(maxsize=16)
def template_strings(source: str) -> frozenset[str]:
    """The string constants `source` holds (the roles it compares a message's with among them);
    none where it does not parse."""
    import jinja2
    from jinja2 import nodes

    try:
        tree = environment().parse(source)
    except (jinja2.TemplateSyntaxError, RecursionError):
        return frozenset()
    return frozenset(c.value for c in tree.find_all(nodes.Const) if isinstance(c.value, str))


# a loop over a message's content: `{% for part in message['content'] %}` (Gemma 3's, Llama 4's)
_CONTENT_LOOP = re.compile(r"""\{%[-+]?\s*for\s+\w+\s+in\s+\w+\s*(?:\.\s*content\b|\[\s*['"]content['"]\s*\])""")


def takes_content_parts(source: str) -> bool:
    """Whether `source` loops over a message's content, as a template that takes OpenAI's content
    parts does (vLLM's "openai" content format, which it detects so too, from the loop)."""
    return _CONTENT_LOOP.search(source) is not None


def template_variables(messages, add_generation_prompt, special_tokens, extra) -> dict[str, Any]:
    """What a template sees: transformers' variables (tools and documents always defined, as none
    when not given), the special tokens the tokenizer has, and `extra` ones. One it has not (Qwen's BOS)
    is undefined, as transformers leaves it: `{{ bos_token }}` writes nothing, not "None"."""
    variables: dict[str, Any] = {"tools": None, "documents": None}
    variables.update((name, text) for name, text in (special_tokens or {}).items() if text is not None)
    variables.update(extra)
    variables["messages"] = messages
    variables["add_generation_prompt"] = add_generation_prompt
    return variables


def render_chat_template(
    source: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    special_tokens: dict[str, str | None] | None = None,
    **extra: Any,
) -> str:
    """Render `source` for `messages`.

    `special_tokens` (bos_token, eos_token, ...) become template variables, as
    do `extra` ones (tools=..., documents=..., enable_thinking=...).
    """
    import jinja2

    variables = template_variables(messages, add_generation_prompt, special_tokens, extra)
    try:
        return compile_template(source).render(**variables)
    except jinja2.TemplateError as e:
        raise TokenizerError(f"chat template: {e}") from None
