"""Requests' own chat templates: rendered as transformers renders them, and stopped, with the bound
named, where they would take the server's memory or time."""

import re
import time
import tracemalloc

import pytest

from linnet.nest.bounded_template import MAX_RANGE, MAX_TEXT, TemplateLimitError, render_bounded
from linnet.nest.errors import TokenizerError
from linnet.nest.template_sandbox import TemplateSandbox

# ChatML in the way SmolLM2's and Qwen's templates write it, with tools and a loop over a range
CHATML = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if loop.first and m.role != 'system' %}<|im_start|>system\nYou are helpful."
    "<|im_end|>\n{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% for i in range(2) %}{{ '-' * 3 }}{{ i + 1 }}{% endfor %}{{ bos_token }}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MESSAGES = [{"role": "user", "content": "Hi, é \u4e2d 🙂"}, {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": ""}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def sandbox():
    box = TemplateSandbox(seconds=1.5)
    box.warm()
    yield box
    box.close()


def reference(**kw):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<s>": 0, "x": 1}, unk_token="x")),
                                  bos_token="<s>")
    tok.chat_template = CHATML
    return tok.apply_chat_template(MESSAGES, tokenize=False, **kw)


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_a_requests_template_renders_as_transformers_does(sandbox, generation_prompt):
    expected = reference(add_generation_prompt=generation_prompt, tools=TOOLS)
    kw = dict(add_generation_prompt=generation_prompt, special_tokens={"bos_token": "<s>"}, tools=TOOLS)
    assert render_bounded(CHATML, MESSAGES, **kw) == expected
    assert sandbox.render(CHATML, MESSAGES, **kw) == expected


@pytest.mark.parametrize("source, needle", [
    ("{% for i in range(10**9) %}x{% endfor %}", f"range() of 1000000000 items; at most {MAX_RANGE}"),
    ('{{ "x" * 10**10 }}', "'*' would make 10000000000 items"),
    ("{{ [1, 2] * 10**9 }}", "'*' would make 2000000000 items"),
    ("{{ 2 ** (10 ** 9) }}", "'**' would make an integer"),
    ("{% set a = 'x' * 10**7 %}{{ a + a }}", "'+' would make 20000000 items"),
    ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", f"passed {MAX_TEXT} characters"),
    ("{{ (2 ** 60000) * (2 ** 60000) }}", "'*' would make an integer of more than 65536 bits"),
])
def test_sizes_past_a_bound_are_refused_before_they_are_made(source, needle):
    # made, `a + a` would have taken 20 MB beside the 10 MB of `a`, and 2 ** (10 ** 9) 125 MB (and hours); the
    # text a template may write is 16 Mi characters
    tracemalloc.start()
    try:
        with pytest.raises(TemplateLimitError, match=re.escape(needle)):
            render_bounded(source, MESSAGES)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 * 2**20, peak


@pytest.mark.parametrize("source, in_python, needle", [
    ("{{ 10.0 ** 400 }}", lambda: 10.0 ** 400, "Numerical result out of range"),
    ("{{ (2 ** 2000) | float }}", lambda: float(2 ** 2000), "int too large to convert to float")])
def test_a_number_past_a_float_is_a_tokenizer_error(source, in_python, needle):
    """Python's OverflowError (float's ** past its range, int to float), as it would raise in
    transformers' rendering: said as the template's error, not as a failure of the server."""
    with pytest.raises(OverflowError, match=needle):
        in_python()
    with pytest.raises(TokenizerError, match=rf"^chat template: .*{needle}"):
        render_bounded(source, MESSAGES)


def test_a_templates_own_errors_are_tokenizer_errors(sandbox):
    for source, needle in (("{% for %}", "line 1"), ("{{ raise_exception('alternate!') }}", "alternate!"),
                           ("{{ 1 / 0 }}", "ZeroDivisionError"), ("{{ messages.append(1) }}", "unsafe")):
        with pytest.raises(TokenizerError, match=needle):
            sandbox.render(source, MESSAGES)


@pytest.mark.parametrize("source, needle", [
    # what no single operation shows: the worker's time and memory bound it
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "within 1.5 s"),
    ("{% macro f(n) %}{% if n < 60 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
     "within 1.5 s"),
    ("{% set ns = namespace(a=[1]) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}"
     "{{ ns.a }}", "within 1.5 s"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
])
def test_a_hostile_template_is_stopped_and_the_sandbox_goes_on(sandbox, source, needle):
    start = time.monotonic()
    with pytest.raises(TemplateLimitError, match=needle):
        sandbox.render(source, MESSAGES)
    assert time.monotonic() - start < 1.5 + 10  # the bound, and a worker's start on a loaded machine
    assert sandbox.render("{{ messages[0].content }}", MESSAGES) == MESSAGES[0]["content"]


@pytest.mark.parametrize("source", [
    '{{ "x".ljust(10**10) }}',
    "{% set ns = namespace(s='xx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
    "{{ ns.s | length }}",
])
def test_a_template_heaping_up_memory_is_stopped_at_the_memory_bound(source):
    """Memory, asked for at once or doubled step by step, meets the worker's memory bound: a
    sandbox whose time bound is far off (on a loaded machine the doubling took more than 1.5 s
    to reach 512 MiB, and met the time bound first), which goes on after it."""
    box = TemplateSandbox(seconds=60)
    try:
        with pytest.raises(TemplateLimitError, match="more than 512 MiB of memory"):
            box.render(source, MESSAGES)
        assert box.render("{{ messages[0].content }}", MESSAGES) == MESSAGES[0]["content"]
    finally:
        box.close()


def _children(pid: int) -> list[int]:
    import os

    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.isdigit() and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _state(pid: int) -> tuple:
    """(state letter, nice) of a process; ("gone", None) where it is no more."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return "gone", None
    return fields[0], int(fields[16])


@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="reads processes from /proc (Linux)")
def test_a_worker_yields_to_the_server_and_ends_with_it_even_mid_render():
    """A worker runs at nice 10, below the server; and where the server dies while a template loops
    (killed, say), the worker does not loop on for ever: it ends within seconds."""
    import os
    import signal
    import subprocess
    import sys

    slow = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    server = subprocess.Popen([sys.executable, "-c", (
        "from linnet.nest.template_sandbox import TemplateSandbox\n"
        f"TemplateSandbox(seconds=600).render({slow!r}, [])\n")])
    try:
        deadline = time.monotonic() + 30
        while not (workers := _children(server.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(workers) == 1
        while _state(workers[0]) != ("R", 10) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)  # (past its start: the render under way)
        assert _state(workers[0]) == ("R", 10)
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        deadline = time.monotonic() + 10
        while _state(workers[0])[0] not in ("gone", "Z") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _state(workers[0])[0] in ("gone", "Z")
    finally:
        server.kill()
        server.wait()


@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="reads processes from /proc (Linux)")
def test_a_warmed_sandbox_renders_on_the_worker_it_started_and_close_ends_it():
    import os

    def workers():
        found = set()
        for pid in _children(os.getpid()):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"template_worker" in f.read():
                        found.add(pid)
            except OSError:  # (ended since)
                pass
        return found

    before = workers()
    box = TemplateSandbox()
    box.warm()
    started = workers() - before
    assert len(started) == 1
    assert box.render("{{ messages[0].content }}", MESSAGES) == MESSAGES[0]["content"]
    assert workers() - before == started
    box.close()
    assert all(_state(pid)[0] in ("gone", "Z") for pid in started)
