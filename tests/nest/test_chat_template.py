"""The Jinja environment chat templates render in."""

import pytest

from linnet.nest.chat_template import render_chat_template
from linnet.nest.errors import TokenizerError

MSGS = [{"role": "user", "content": "<b>é</b>"}]


def render(src, messages=MSGS, **kw):
    return render_chat_template(src, messages, special_tokens={"bos_token": "<s>", "eos_token": "</s>"}, **kw)


def test_variables_and_generation_prompt():
    src = "{{ bos_token }}{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}{{ eos_token }}{% endfor %}" \
          "{% if add_generation_prompt %}assistant:{% endif %}"
    assert render(src) == "<s>user:<b>é</b></s>assistant:"
    assert render(src, add_generation_prompt=False) == "<s>user:<b>é</b></s>"


def test_trim_and_lstrip_blocks():
    src = "a\n    {% if true %}\nb\n    {% endif %}\nc"
    assert render(src) == "a\nb\nc"


def test_loopcontrols():
    src = "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    assert render(src) == "02"


def test_tojson_keeps_text_as_is():
    assert render("{{ messages[0] | tojson }}") == '{"role": "user", "content": "<b>é</b>"}'
    assert render("{{ {'b': 1, 'a': [1]} | tojson(indent=2, sort_keys=True) }}") == '{\n  "a": [\n    1\n  ],\n  "b": 1\n}'


def test_raise_exception():
    with pytest.raises(TokenizerError, match="roles must alternate"):
        render("{{ raise_exception('roles must alternate') }}")


def test_generation_tag_and_tools_default():
    src = "{% generation %}x{% endgeneration %}{{ tools is none }}|{{ strftime_now('%Y') | length }}"
    assert render(src) == "xTrue|4"
    assert render("{{ tools[0] }}", tools=["t"]) == "t"


def test_sandbox():
    with pytest.raises(TokenizerError):
        render("{{ messages.__class__.__mro__ }}")
    with pytest.raises(TokenizerError):
        render("{% set _ = messages.append(1) %}")


def test_syntax_error_has_line():
    with pytest.raises(TokenizerError, match="line 2"):
        render("ok\n{% if %}")
