"""The process that renders requests' own chat templates: `python -m linnet.nest.template_worker MEMORY`.

`template_sandbox.TemplateSandbox` starts it and speaks to it a JSON line each
way: a render in (`template`, `messages`, `add_generation_prompt`,
`special_tokens`, `extra`), `{"text": ...}` or `{"error": ..., "limit": bool}`
out. It first says `{"ready": true}`, once imported and held to MEMORY bytes
more than it then has (its address space: a template that heaps up more gets a
MemoryError here, not the server's memory). A reply with `"exiting": true` is
its last (after a MemoryError or a recursion too deep, a fresh process is
safer); its input's end ends it too, and its parent's end, even mid-render. It
runs at a lower priority than the server (nice 10).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

# (imported before the memory cap, which counts what this process has then)
from .bounded_template import TemplateLimitError, render_bounded
from .errors import TokenizerError


def _hold_memory(extra: int) -> None:
    """Cap this process's address space at what it has now plus `extra` bytes (Linux; elsewhere no cap)."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * resource.getpagesize()
    except (ImportError, OSError, ValueError):
        return
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, size + extra))


def _answer(job: dict, memory: int) -> dict:
    try:
        return {"text": render_bounded(job["template"], job["messages"],
                                       add_generation_prompt=job["add_generation_prompt"],
                                       special_tokens=job["special_tokens"], **job["extra"])}
    except TemplateLimitError as e:
        return {"error": str(e), "limit": True}
    except TokenizerError as e:
        return {"error": str(e), "limit": False}
    except MemoryError:
        return {"error": f"it needed more than {memory >> 20} MiB of memory, the most a request's template "
                         f"may use", "limit": True, "exiting": True}
    except RecursionError:
        return {"error": "it recursed too deeply (a macro calling itself?)", "limit": True, "exiting": True}
    except Exception as e:  # whatever else a template's operation raises (a TypeError, ...) is the template's
        return {"error": f"chat template: {type(e).__name__}: {e}", "limit": False}


def _exit_with(parent: int) -> None:
    """End this process once `parent` has (a render in a loop reads no more input to see it gone)."""
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def main(argv: list[str]) -> int:
    memory = int(argv[0])
    os.nice(10)  # a template's loop yields the cores to the server's engine
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing a render does may write into the replies
    _hold_memory(memory)
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        reply = _answer(json.loads(line), memory)
        out.write(json.dumps(reply) + "\n")  # ASCII: a lone surrogate a client sent goes through as \\ud800
        out.flush()
        if reply.get("exiting"):
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
