"""The `linnet` command: compile | check | ir | cards | generate | serve | export."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import warnings
from pathlib import Path

from linnet.errors import LinnetError
from linnet.ir.types import FLOAT_DTYPE_NAMES
from linnet.serve.request import MAX_LOGPROBS, SAMPLING_RANGES


def _generic(pair: str) -> tuple:
    """One --generic NAME=VALUE as (name, value): a bad one is the flag's error, not the source's."""
    from linnet.ir.specialize import generic_value

    name, eq, value = (part.strip() for part in pair.partition("="))
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"takes NAME=VALUE, not {pair!r}")
    try:
        return name, generic_value(name, value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _generics(pairs: list | None) -> dict:
    generics = {}
    for name, value in pairs or []:
        if name in generics and generics[name] != value:  # which was meant, the command cannot know
            raise _FlagError(f"--generic {name} is given twice: {name}={generics[name]} and {name}={value}")
        generics[name] = value
    return generics


def _source_module(name: str):
    """The checked module a source command reads: a .linnet file; a card's name in the Nest registry
    (`linnet compile tiny-llama`); or a checkpoint (a model directory, a .gguf file, a repository id in
    the Hugging Face cache), the card written from its config, as `generate` and `serve` take them."""
    from linnet.compiler import check_file
    from linnet.ir.verify import verify
    from linnet.nest.load import is_repo_id, resolve_card

    p = Path(name)
    if not name.endswith(".linnet") and (p.is_dir() or p.suffix.lower() == ".gguf" and p.is_file() or is_repo_id(name)):
        module = resolve_card(name, None)[0]
        verify(module)
        return module
    if p.exists() or "/" in name or name.endswith(".linnet"):
        return check_file(name)  # (a path that is not there is reported as the file it names)
    from linnet.nest.registry import card

    return check_file(card(name, also_looked=f" (nor a file {name} here)").path)


def cmd_check(args) -> int:
    module = _source_module(args.file)
    missing = [name for name, c in module.config.items() if name not in module.config_values and c.default is None]
    if args.generic and module.card is None and missing:
        raise _FlagError(f"{args.file} is an architecture whose config value `{missing[0]}` has no default: its "
                         f"numbers, and so --generic, are checked through a card that imports it")
    if args.generic or module.card is not None or not missing:
        # What only numbers can tell (a missing config value, an inexact division) is checked
        # whenever the config is known: for a card, or an architecture whose every value has a default.
        from linnet.ir.specialize import specialize

        specialize(module, _generics(args.generic), args.numerics)
    params, entries = len(module.params), len(module.entries)
    print(f"{args.file}: ok ({params} param{'' if params == 1 else 's'}, {entries} entr{'y' if entries == 1 else 'ies'})")
    return 0


def cmd_ir(args) -> int:
    from linnet.ir.printer import print_module

    sys.stdout.write(print_module(_source_module(args.file)))
    return 0


def _note_exact_numerics(numerics: str, dtype: str | None) -> None:
    """Says so where a 16-bit T is asked for with exact numerics, which compute in f32."""
    if numerics == "exact" and dtype in ("bf16", "f16"):
        print(f"linnet: note: exact numerics compute in f32; T={dtype} takes effect with --numerics fast",
              file=sys.stderr)


def cmd_compile(args) -> int:
    from linnet.compiler import generate

    generics = _generics(args.generic)
    _note_exact_numerics(args.numerics, generics.get("T"))
    if args.output == "":
        raise _FlagError("-o/--output needs a file name (or - for standard output)")
    module = _source_module(args.file)
    if args.output not in (None, "-"):
        _not_a_source(Path(args.output), module)
    source = generate(module, args.backend, generics, args.numerics)
    if args.output in (None, "-"):  # `-`: standard output, as argparse.FileType and `generate`'s prompt take it
        sys.stdout.write(source)
    else:
        try:
            Path(args.output).write_text(source)
        except OSError as err:  # (a write that fails once the file is open names no file: /proc/version's EIO)
            err.filename = err.filename or args.output
            raise
    return 0


def _not_a_source(output: Path, module) -> None:
    """Refuses an output that is one of the files the model was read from (the card, its architecture,
    a base), as gcc refuses an output that is its input: writing it would lose that source."""
    for path in (module.card_path, module.path, *module.bases):
        if path and output.exists() and Path(path).exists() and output.samefile(path):
            raise _FlagError(f"-o {output} is {path}, a source of this model: writing there would replace it")


def _count(n: float, units=("", "K", "M", "B", "T")) -> str:
    for unit in units:
        # the unit is chosen by the number as printed: 999.9M prints 1.0B, not 1000M
        text = f"{n:.1f}" if unit and abs(n) < 99.95 else f"{n:.0f}"
        if abs(float(text)) < 1000 or unit == units[-1]:
            return text + unit
        n /= 1000
    return str(n)


def cmd_cards(args) -> int:
    from linnet import nest
    from linnet.nest.locate import download_command
    from linnet.nest.memory import human_bytes

    rows = [("CARD", "PARAMS", "SIZE (bf16)", "SOURCE", "WEIGHTS")]
    for info in nest.cards():
        n = info.parameters()
        repo = info.hf_repo
        found, _ = info.weights()
        if found:
            where = found
        elif repo:
            where = f"not found ({download_command(repo)})"
        else:
            where = 'none (a test card: weights="random")'
        rows.append((info.name, _count(n), human_bytes(2 * n), repo or "-", where))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


def cmd_generate(args) -> int:
    import time

    from linnet import nest
    from linnet.nest.progress import Progress
    from linnet.serve.engine import Engine
    from linnet.serve.openai_replies import TextStream
    from linnet.serve.request import Request, tokens

    if args.system is not None and not args.chat:
        raise _FlagError("--system needs --chat")
    if args.chat_template is not None and not args.chat:  # (it would be read, and go unused)
        raise _FlagError("--chat-template needs --chat")
    if args.prompt == "-":  # (before the model loads: a pipe that fails says so at once)
        # less the newline that ends a file or an echo, as llama-cli's -f drops it: a prompt typed as an
        # argument has none, and the newline's token changed the reply
        args.prompt = sys.stdin.read().removesuffix("\n")
    structure = _structure(args)  # (the request's numbers are the flags' types: checked as they are parsed)
    _note_exact_numerics(args.numerics, args.dtype)  # (asked for: the default is None, bf16 with fast)
    # exact numerics compute in f32 whatever T: the note above says so where a 16-bit T was asked for
    generics = _load_generics(1, args.max_seq, (args.dtype or "bf16") if args.numerics == "fast" else "f32")
    _use_compile_cache(args)
    try:
        with warnings.catch_warnings():  # (without one, the error below says why, once)
            warnings.filterwarnings("ignore", "no tokenizer loaded from ")
            model = nest.load(args.card, backend=args.backend, device=args.device, numerics=args.numerics,
                              compile=True, generics=generics, cast_dtype=True, weights=args.weights,
                              tokenizer=args.tokenizer or True, quantization=args.quantization)
    except ValueError as err:  # what was asked cannot be had (as serve's): --quantization gguf with --backend jax
        raise _UsageError(_as_flags(str(err))) from None
    tok = model.tokenizer
    if tok is None:
        whose = f"no tokenizer loaded from {model.info['no_tokenizer']}" if "no_tokenizer" in model.info else \
            f"{model.weights}: no tokenizer found with these weights"
        if model.weights == "random":  # they take the tokenizer of the card's own weights
            from linnet.nest.load import find_card_weights

            found = find_card_weights(model.card, model.module)[0]
            whose = (f"random weights take the tokenizer of {model.card}'s own weights, and "
                     + (f"{found} holds none" if found else "those were not found"))
        raise _UsageError(f"{whose}; `generate` needs one (--tokenizer names a model directory or GGUF to take "
                          f"it from)")
    _note_context(model, args.max_seq)
    _use_chat_template(model, args.chat_template)
    if args.chat:
        if not tok.chat_template:
            raise _UsageError(f"{tok.source or model.weights}: no chat template, which --chat needs (a base model): "
                              f"give one with --chat-template FILE, or leave out --chat to continue the prompt as text")
        messages = [{"role": "system", "content": args.system}] if args.system is not None else []
        messages.append({"role": "user", "content": args.prompt})
        # the template writes the special tokens itself (as transformers' apply_chat_template does)
        ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)
    else:
        ids = tok.encode(args.prompt)
    if not ids:
        raise _UsageError("the prompt is empty")
    room = model.max_seq - len(ids)
    if room < 1:
        raise _UsageError(f"the prompt is {tokens(len(ids))}; --max-seq {model.max_seq} leaves no room to generate")
    asked = room if args.max_new_tokens == -1 else args.max_new_tokens  # (-1: llama-cli's "until the context is full")
    max_new = min(asked, room)
    if max_new < asked:
        print(f"linnet: note: generating at most {max_new} tokens (--max-seq {model.max_seq})", file=sys.stderr)

    engine = Engine(model, seed=args.seed or 0)
    req = Request(prompt=ids, max_new_tokens=max_new, temperature=args.temperature, top_p=args.top_p,
                  top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                  presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                  ignore_eos=args.ignore_eos, seed=args.seed, structure=structure, stop=args.stop or [])
    if model.backend == "jax" or model.compile:  # compile (XLA) or capture (CUDA graphs) before the clock starts
        bar = Progress(f"compiling {model.card} ({model.backend})")
        _warm_up(engine, req)
        bar.close()
    # the text as the server streams it: what may yet turn out to be a stop string is held back, and the
    # end is the engine's text, cut before the stop string that ended it
    text = TextStream(tok, ids, req.stop)
    out = sys.stdout
    start = time.perf_counter()
    comp = engine.submit(req)
    shown = 0
    with engine.stepping():
        while engine.has_work():
            engine.step()
            text.add(comp.tokens[shown:])
            shown = len(comp.tokens)
            piece = text.ready() if comp.finish_reason is None else ""  # (the last tokens' text: the engine's)
            if piece:
                out.write(piece)
                out.flush()
    seconds = time.perf_counter() - start
    out.write(text.finish(comp.text) + "\n")
    out.flush()
    if comp.finish_reason == "error":
        raise _UsageError(comp.error or "generation failed")
    n = len(comp.tokens)
    first = (comp.first_token_at - comp.submitted_at) if comp.first_token_at else 0.0
    print(f"[{tokens(n)} in {seconds:.2f} s: {n / seconds if seconds else 0.0:.1f} tokens/s; prompt {tokens(len(ids))}, "
          f"first token after {first:.2f} s; {model.backend}, {model.dtype}]", file=sys.stderr)
    if comp.finish_reason == "length" and n == max_new:  # not the model's end: the reply may be cut mid-way
        # (-1 asks for as many as the row holds: --max-seq's room ended it, not a count)
        ended = "--max-seq" if args.max_new_tokens == -1 else \
            "--max-new-tokens (or --max-seq)" if max_new < args.max_new_tokens else "--max-new-tokens"
        print(f"[cut at {tokens(n)}: {ended} ended it before the model did]", file=sys.stderr)
    return 0


def _structure(args):
    """The structure `generate` holds its output to (--json-schema, --regex, --grammar), if any; a
    schema or grammar is the text itself or a file holding it."""
    from linnet.serve.structured import Structure

    asked = [(kind, value) for kind, value in (("json", args.json_schema), ("regex", args.regex),
                                               ("grammar", args.grammar)) if value is not None]
    if len(asked) > 1:
        raise _FlagError("give one of --json-schema, --regex, --grammar")
    if not asked:
        return None
    kind, value = asked[0]
    flag = {"json": "--json-schema", "grammar": "--grammar"}.get(kind)
    if kind == "json":
        value = _text_or_file(flag, value, "a JSON schema", lambda text: text.lstrip().startswith("{"))
    elif kind == "grammar":  # every rule is written `name: ...` (Lark) or `name ::= ...` (GBNF)
        value = _text_or_file(flag, value, "a grammar", lambda text: ":" in text)
    if kind == "json":
        try:
            json.loads(value)
        except ValueError as err:
            raise _FlagError(f"{flag} {asked[0][1]}: not JSON ({err})") from None
    structure = Structure(kind, value)
    problem = structure.problem()  # before the model loads
    if problem is not None:
        raise _FlagError(f"{flag or '--regex'} {asked[0][1]}: cannot hold an output to it: {problem}")
    return structure


def _text_or_file(flag: str, given: str, what: str, is_text) -> str:
    """What a flag that takes a text or a file holding it was given: the file's text where `given` is a
    file, else `given` where `is_text(given)` says it is the text itself; anything else is a file's
    name that is not there (said so, not parsed as `what` and refused for its syntax)."""
    if os.path.isfile(given):  # (False, not an error, for a text too long to be a file's name)
        try:
            return Path(given).read_text()
        except UnicodeDecodeError as err:
            raise _FlagError(f"{flag} {given}: not UTF-8 text ({err.reason}: byte 0x{err.object[err.start]:02x} at "
                             f"offset {err.start})") from None
    if is_text(given):
        return given
    raise _FlagError(f"{flag} {given}: {'a directory, not a file' if os.path.isdir(given) else 'no such file'}, "
                     f"nor {what}")


def _warm_up(engine, req) -> None:
    """What one prompt's run compiles: its prefill pass, decode, and its sampler, and no other pass size
    (`Engine.warmup` prepares every pass size a server may meet)."""
    engine.runner.warmup(engine._packs_of(len(req.prompt)), [engine.sampling_mode(req)])
    engine.model.reset()


def _as_flags(message: str) -> str:
    """nest.load's words for its arguments (device='cuda:1', shards=4) as the flags that gave them
    (--device cuda:1, --shards 4): what the user typed, and would type instead."""
    import re

    message = re.sub(r"\b(device|numerics|quantization)='([^']*)'", r"--\1 \2", message)
    return re.sub(r"\bshards=(\d+)", r"--shards \1", message)


class _UsageError(Exception):
    """A problem with what was asked, reported as one line."""


class _FlagError(_UsageError):
    """A flag's value, or flags that do not go together, found past what argparse checks itself:
    reported as argparse reports its own (the command's usage, then the line; exit status 2)."""


# vLLM's names of the types; its default "auto" (the checkpoint's type) is bf16 here, the type the
# cards' models are trained and published in
_DTYPE_NAMES = {**FLOAT_DTYPE_NAMES, "auto": "bf16"}


def _quantization(text: str) -> str:
    """--quantization: vLLM's "gguf" (a GGUF's Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_NL /
    IQ4_XS linears run in their blocks); its others refused."""
    from linnet.nest.quantized import QUANTIZATIONS, kept_types  # (here: linnet.nest is slow to import, and few ask)

    if text not in QUANTIZATIONS:
        raise argparse.ArgumentTypeError(f"{text!r} is not taken: 'gguf' runs a GGUF's {kept_types()} weights in "
                                         "their blocks (torch on the CPU); other weights run in --dtype (bf16, f16 or "
                                         "f32)")
    return text


_QUANTIZATION_HELP = ("gguf: a .gguf's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS "
                      "linear weights run in their blocks, not decoded to --dtype at load (torch on the CPU, "
                      "--numerics fast; vLLM's --quantization gguf)")


def _dtype_name(text: str) -> str:
    return _DTYPE_NAMES.get(text, text)


def _export_dtype(text: str) -> str:
    """export --dtype: vLLM's names taken, Q8_0 in any case, and llama.cpp's other quantized types refused
    with how to make one."""
    from linnet.export import GGUF_TYPES, dtype_refusal, quantized_type

    name = _dtype_name(text)
    if name.lower() in GGUF_TYPES:
        return name.lower()
    if quantized_type(name):
        raise argparse.ArgumentTypeError(dtype_refusal(name))
    return name


def _use_chat_template(model, given: str | None) -> None:
    """--chat-template (as vLLM's): a file, or the Jinja template itself, in place of the tokenizer's."""
    if given is None:
        return
    if model.tokenizer is None:
        raise _UsageError("--chat-template needs a tokenizer, and these weights have none (see --tokenizer)")
    model.tokenizer.chat_template = _text_or_file("--chat-template", given, "a Jinja template",
                                                  lambda text: "{{" in text or "{%" in text)
    try:
        model.tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)
    except Exception as err:  # a syntax error, or a template that cannot render a plain user turn
        raise _FlagError(f"--chat-template: the template does not render a user message: {err}") from None


def _generation_config(text: str):
    """--generation-config, as vLLM's: auto, vllm, or a folder whose generation_config.json sets the
    sampling defaults (as the request fields they are)."""
    from linnet.nest.tokenizer import _sampling_defaults

    if text in ("auto", "vllm"):
        return text
    path = Path(text) / "generation_config.json" if os.path.isdir(text) else Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: not auto, vllm, or a folder holding generation_config.json")
    try:
        config = json.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise argparse.ArgumentTypeError(f"{path}: not JSON ({err})") from None
    if not isinstance(config, dict):
        raise argparse.ArgumentTypeError(f"{path}: not a JSON object")
    return _sampling_defaults(config, path)


def _generation_override(text: str) -> dict:
    """--override-generation-config, as vLLM's: a JSON object of generation config fields, by the request
    field each sets (max_new_tokens: max_tokens); a null leaves that field no default (vLLM drops a
    null after the override), and each other value is checked here, once: a bad one names its field
    and what it takes (`tokenizer.sampling_problem`, the ranges requests are held to)."""
    from linnet.nest.tokenizer import SAMPLING_DEFAULTS, sampling_problem

    try:
        config = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {text!r} ({err})") from None
    if not isinstance(config, dict):
        raise argparse.ArgumentTypeError(f"not a JSON object: {text!r}")
    unknown = sorted(set(config) - set(SAMPLING_DEFAULTS))
    if unknown:  # (a field Linnet would not use: said, rather than dropped)
        raise argparse.ArgumentTypeError(f"{unknown[0]!r} is not a field it sets; those are "
                                         f"{', '.join(SAMPLING_DEFAULTS)}")
    for key, value in config.items():
        problem = None if value is None else sampling_problem(key, value)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{key!r} must be {problem}, not {value!r}")
    return {SAMPLING_DEFAULTS[key]: value for key, value in config.items()}


def _use_generation_config(model, given, override: dict | None) -> None:
    """The sampling defaults of requests that leave fields out, as vLLM takes them: the model's
    generation config (auto), none (vllm), or a folder's; then --override-generation-config's."""
    defaults = getattr(model.tokenizer, "sampling_defaults", None)
    if defaults is None:
        if isinstance(given, dict) or override:
            raise _UsageError("--generation-config and --override-generation-config set what requests default to "
                              "through the tokenizer, and this model has none (see --tokenizer)")
        return
    if given == "vllm":
        defaults.clear()  # OpenAI's defaults alone, whatever the model's config says
    elif isinstance(given, dict):
        defaults.clear()
        defaults.update(given)
    for field, value in (override or {}).items():  # (a null: no default for that field, as vLLM has it)
        if value is None:
            defaults.pop(field, None)
        else:
            defaults[field] = value
    if defaults:  # as vLLM says it, so that a reply sampled otherwise than the API's defaults is explained
        print(f"linnet: the generation config sets the sampling defaults of requests that leave them out: "
              f"{defaults} (--generation-config vllm: the API's own)", file=sys.stderr)


def _default_compile_cache() -> str:
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    from linnet import user_cache

    try:
        return str(user_cache.directory("xla"))
    except OSError:  # no home directory: no cache unless one is named
        return "none"


def _load_generics(batch: int, max_seq: int | None, dtype: str) -> dict:
    """nest.load's generics for the flags: no MaxSeq where --max-seq was not given (nest.load then
    takes the model's context, fit to memory)."""
    return {"Batch": batch, "T": dtype, **({"MaxSeq": max_seq} if max_seq is not None else {})}


def _note_context(model, asked: int | None) -> None:
    """One line on standard error saying the MaxSeq nest.load chose and which flag sets another, as
    vLLM logs its max_model_len."""
    if asked is None and "context" in model.info:
        print(f"linnet: note: {model.info['context'].note('--max-seq')}", file=sys.stderr)


def _use_compile_cache(args) -> None:
    """Keeps XLA's executables between runs (JAX's persistent compilation cache), before anything
    compiles: a server started again on the same card and shapes reads its executables back
    (SmolLM2's server on this CPU answered 20 s after a cold start, 14 s after a start from the cache)."""
    if args.backend != "jax" or args.compile_cache == "none":
        return
    try:  # here, once, rather than JAX's warning at each entry it could not read or write
        Path(args.compile_cache).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        warnings.warn(f"--compile-cache {args.compile_cache}: {err.strerror or err}; compiled executables are not "
                      f"kept this run ('none' says so without this warning)")
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", args.compile_cache)
    # 0.1 s: every entry and draw (a compiled layer loop takes 0.3-0.5 s), not the eager ops (under 0.05)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)


def _add_compile_cache(parser) -> None:
    parser.add_argument("--compile-cache", default=_default_compile_cache(), metavar="DIR",
                        help="jax: where compiled executables are kept between runs, so that a second start "
                             "compiles nothing ('none': nowhere; default: $JAX_COMPILATION_CACHE_DIR where it is set, "
                             "else xla in Linnet's cache: %(default)s here)")


def cmd_serve(args) -> int:
    from linnet import nest
    from linnet.serve.cors import CorsPolicy
    from linnet.serve.server import serve
    from linnet.serve.tool_parsers import parser_for_template

    _note_exact_numerics(args.numerics, args.dtype)  # (as generate's: asked for, bf16 by default with fast)
    generics = _load_generics(args.batch, args.max_seq, (args.dtype or "bf16") if args.numerics == "fast" else "f32")
    if args.shards == 1 and args.backend != "jax":
        args.shards = None  # one device, as torch runs anyway: a vLLM command line's -tp 1 runs as it stands
    if args.shards is not None and args.backend != "jax":
        raise _FlagError(f"--shards {args.shards} spreads a JAX model over devices: pass --backend jax "
                         "(torch runs on one, --shards 1)")
    _check_address(args.host, args.port)  # before minutes of loading and warming up
    _check_tls(args.ssl_certfile, args.ssl_keyfile)
    _use_compile_cache(args)
    try:
        model = nest.load(args.card, backend=args.backend, device=args.device, numerics=args.numerics,
                          compile=not args.enforce_eager, generics=generics, cast_dtype=True, weights=args.weights,
                          shards=args.shards, tokenizer=args.tokenizer or True, quantization=args.quantization)
    except ValueError as err:  # what was asked cannot be had: more shards than devices, an unknown device
        raise _UsageError(_as_flags(str(err))) from None
    _note_context(model, args.max_seq)
    _use_chat_template(model, args.chat_template)
    _use_generation_config(model, args.generation_config, args.override_generation_config)
    # vLLM's VLLM_API_KEY too: a vLLM user's environment that guards its server guards this one
    api_key = args.api_key or os.environ.get("LINNET_API_KEY") or os.environ.get("VLLM_API_KEY") or None
    template = getattr(model.tokenizer, "chat_template", None)
    parser = args.tool_call_parser or parser_for_template(template) or model.module.meta.get("tool_call_parser")
    if args.enable_auto_tool_choice and parser is None:
        raise _FlagError("--enable-auto-tool-choice needs --tool-call-parser (the card names none)")
    reasoning = args.reasoning_parser or model.module.meta.get("reasoning_parser")
    from linnet.serve.reasoning import PARSERS as REASONING
    from linnet.serve.tool_parsers import PARSERS as TOOLS

    for kind, name, known in (("tool-call", parser, TOOLS), ("reasoning", reasoning, REASONING)):
        if name is not None and name not in known:  # only a card's meta can name one the flags would refuse
            raise _UsageError(f"{model.card}: its meta names the {kind} parser {name!r}, which Linnet does not "
                              f"have; there are {', '.join(sorted(known))}")
    # the card as typed where it is a repository id or a checkpoint's path (as `vllm serve` takes either) is the
    # name clients send, as vLLM's; the card's own name is taken too (a .linnet file's path is only the card's)
    typed = [args.card] if args.card != model.card and not args.card.lower().endswith(".linnet") else []
    names = args.name or typed + [model.card]
    serve(model, names[0], other_names=tuple(names[1:]), host=args.host, port=args.port, api_key=api_key,
          tool_parser=parser, reasoning_parser=reasoning,
          structure_in_reasoning=args.structured_outputs_in_reasoning, stored_responses=args.stored_responses,
          trust_request_chat_template=args.trust_request_chat_template,
          log_level=args.uvicorn_log_level, access_log=not args.disable_uvicorn_access_log,
          cors=CorsPolicy(args.allowed_origins, args.allowed_methods, args.allowed_headers, args.allow_credentials),
          ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile, token_budget=args.token_budget, seed=args.seed,
          max_logprobs=args.max_logprobs, shutdown_timeout=args.shutdown_timeout)
    return 0


SERVE_HINTS = {"vllm": "vllm serve {path}", "llama.cpp": "llama-server -m {path}",
               "triton": "tritonserver --model-repository {parent}"}


def cmd_export(args) -> int:
    from linnet.export import export

    triton = {"name": args.name, "batch": args.batch, "max_seq": args.max_seq, "backend": args.backend}
    given = [f"--{key.replace('_', '-')}" for key, value in triton.items() if value is not None]
    if args.to != "triton" and given:
        raise _FlagError(f"{', '.join(given)}: for --to triton only; a {args.to} export holds the weights, and "
                         f"its server takes its own settings")
    if args.seed is not None and args.weights != "random":  # (it would be dropped: nothing else is drawn)
        source = "the card's own weights" if args.weights is None else f"--weights {args.weights}"
        raise _FlagError(f"--seed: for --weights random only; {source} are written as they are")
    path = export(args.card, args.to, args.output, weights=args.weights, dtype=args.dtype, seed=args.seed,
                  tokenizer=args.tokenizer, **{key: value for key, value in triton.items() if value is not None})
    print(f"linnet: wrote {path}")
    print(f"  serve it with: {SERVE_HINTS[args.to].format(path=path, parent=Path(path).parent)}")
    return 0


def _check_address(host: str, port: int) -> None:
    """A usage error where the server could not listen on host:port (taken by another process, or
    not this machine's address), found by binding it as uvicorn's asyncio server will (SO_REUSEADDR,
    an IPv6 socket for IPv6 alone) and letting go. "" is every interface, as asyncio takes it."""
    import socket

    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise _UsageError(f"--host {host}: {err.strerror}") from None
    where = f"[{host}]:{port}" if ":" in host else f"{host or '*'}:{port}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            probe.bind(address)
        except OSError as err:
            taken = err.errno == errno.EADDRINUSE
            raise _UsageError(f"cannot listen on {where}: "
                              f"{'another process is listening there (--port picks another)' if taken else err.strerror}"
                              ) from None


def _check_tls(certfile: str | None, keyfile: str | None) -> None:
    """A flag error where --ssl-certfile and --ssl-keyfile cannot make an HTTPS server, found by loading
    them as uvicorn will, before the model loads rather than after."""
    import ssl

    if certfile is None and keyfile is None:
        return
    if certfile is None:
        raise _FlagError("--ssl-keyfile needs --ssl-certfile, the certificate its key goes with")
    for flag, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile)):
        if path is not None and not os.path.isfile(path):
            raise _FlagError(f"{flag} {path}: {'a directory, not a file' if os.path.isdir(path) else 'no such file'}")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile)
    except OSError as err:  # (ssl.SSLError is one)
        files = f"--ssl-certfile {certfile}" + (f" --ssl-keyfile {keyfile}" if keyfile else "")
        raise _FlagError(f"{files}: not a PEM certificate chain and the private key that goes with it "
                         f"({getattr(err, 'reason', None) or err.strerror or err})") from None


def _number(lo: float, hi: float | None, out_of_range: str, what: str = "a whole number", kind=int):
    """An argparse type: a `kind` (int or float) from `lo` to `hi` (None: no bound; NaN is in no range),
    else an error for the flag; `out_of_range` is its message, formatted with the value."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not (value >= lo and (hi is None or value <= hi)):
            raise argparse.ArgumentTypeError(out_of_range.format(value))
        return value

    return parse


# a seed torch's and numpy's generators take; a count (rows, positions, tokens, devices), or one that may be
# 0; a TCP port (0: any free one), a fraction; sampling fields as a request takes them (`SAMPLING_RANGES`)
_seed = _number(0, (1 << 63) - 1, "must be from 0 to 2**63 - 1, not {}")
_positive = _number(1, None, "must be 1 or more, not {}")
_nonnegative = _number(0, None, "must be 0 or more, not {}")
_top_k = _number(-1, None, "must be 0 or more, or -1 (0 and -1: all, as vLLM's), not {}")


def _new_tokens(text: str) -> int:
    """generate's --max-new-tokens: a count, or llama-cli's -1 (until the context is full)."""
    return -1 if text.strip() == "-1" else _positive(text)


def _run_seed(text: str) -> int:
    """generate's --seed: a seed, or llama-cli's -1, a random one (its default)."""
    if text.strip() == "-1":
        import secrets

        return secrets.randbits(63)
    return _seed(text)


def _context_flag(model_own: tuple):
    """An argparse type for positions per cache row: a count, or one of `model_own` (vLLM's "auto",
    llama.cpp's "0"), None: the model's own context, fit to memory (`nest.context`)."""
    own = " or ".join(model_own)
    counted = _number(1, None, f"must be 1 or more ({own}: the model's own context), not {{}}")

    def parse(text: str):
        return None if text.strip().lower() in model_own else counted(text)

    return parse


_max_seq = _context_flag(("auto",))  # --max-seq, vLLM's --max-model-len (its auto fits the model's to memory)
_ctx_size = _context_flag(("auto", "0"))  # llama-cli's -c, --ctx-size: 0 is the model's
_port = _number(0, 65535, "a port is 0 to 65535, not {}", what="a port number")
_fraction = _number(0, 1, "must be from 0 to 1, not {}", "a number", float)  # --gpu-memory-utilization
_seconds = _number(0, None, "must be 0 or more seconds (inf: no limit), not {}", "a number", float)


def _sampling_flag(name: str, note: str = ""):
    """An argparse type for a sampling field, in the range a request takes (`SAMPLING_RANGES`)."""
    least, most, _ = SAMPLING_RANGES[name]
    return _number(least, most, f"must be from {least:g} to {most:g}{note}, not {{}}", "a number", float)


_temperature = _sampling_flag("temperature")
_top_p = _sampling_flag("top_p")
_min_p = _sampling_flag("min_p")
# a request's logprobs a token: each token's MAX_LOGPROBS best are what the device computes
_max_logprobs = _number(0, MAX_LOGPROBS, f"must be from 0 to {MAX_LOGPROBS} (the most a token's logprobs list "
                        f"here; vLLM's -1, the whole vocabulary, is not taken), not {{}}")
_penalty = _sampling_flag("repetition_penalty", " (1: none)")


def _stop_text(text: str) -> str:
    if not text:  # (found in every text)
        raise argparse.ArgumentTypeError("an empty stop string")
    return text


def _named(text: str) -> str:
    """A path or a device's name: "" named the current folder (-o, --weights) or the default (--device)."""
    if not text:
        raise argparse.ArgumentTypeError("needs a path or a name, not an empty string")
    return text


def _cors_list(text: str) -> list[str]:
    from linnet.serve.cors import parse_list

    try:
        return parse_list(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


# Each runs as it stands where the embedded default model is installed (tests/nest/test_cli_errors.py parses them).
GENERATE_EXAMPLES = """examples:
  linnet generate smollm2-135m-instruct "What is the capital of France?" --chat
  linnet generate smollm2-135m-instruct "Once upon a time" -n 64 --temp 0.8 --top-k 40 -s 1
  linnet generate smollm2-135m-instruct "Name a cat, as JSON." --chat \\
      -j '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'
  echo "Tell me a joke." | linnet generate smollm2-135m-instruct - --chat --backend jax
"""
SERVE_EXAMPLES = """examples:
  linnet serve smollm2-135m-instruct --batch 8 --max-seq 2048 --port 8000
  linnet serve tiny-llama --weights random --port 8001   # a test card in seconds: prompts as token ids
  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}]}'
"""


def build_parser() -> argparse.ArgumentParser:
    from linnet.cli_foreign import EXPORT as EXPORT_REFUSED
    from linnet.cli_foreign import GENERATE as GENERATE_REFUSED
    from linnet.cli_foreign import SERVE as SERVE_REFUSED
    from linnet.cli_foreign import add_refusals
    from linnet.serve.reasoning import PARSERS as REASONING
    from linnet.serve.tool_parsers import PARSERS

    from linnet import __version__
    from linnet.ir.specialize import DEFAULT_GENERICS

    p = argparse.ArgumentParser(prog="linnet", description="Compile and serve language models written in Linnet.")
    p.add_argument("--version", action="version", version=f"linnet {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def source_cmd(name, help_text, specializes=True):
        s = sub.add_parser(name, help=help_text)
        s.add_argument("file", help="a .linnet card or architecture, a card's name (see `linnet cards`), or a "
                                    "checkpoint (a model directory, a .gguf file, a repository id), whose card is "
                                    "written from its config")
        if not specializes:  # (the checked IR is printed before any number is bound: no generic to take)
            return s
        s.add_argument("--generic", action="append", metavar="NAME=VALUE", type=_generic,
                       help="bind a generic: Batch=8, MaxSeq=256, T=bf16 (repeatable; default: "
                            + ", ".join(f"{k}={v}" for k, v in DEFAULT_GENERICS.items()) + ")")
        s.add_argument("--numerics", choices=["exact", "fast"], default="exact",
                       help="exact (the default): the reference semantics, in f32 whatever T is; fast: computes "
                            "in T, with the backend's fused kernels")
        return s

    c = source_cmd("compile", "write the Python source of a model for one backend")
    c.add_argument("--backend", choices=["torch", "jax"], default="torch", help="(torch)")
    c.add_argument("-o", "--output", help="write here instead of standard output (- is standard output)")
    c.set_defaults(run=cmd_compile)
    source_cmd("check", "parse and check a model (with numbers, for a card or with --generic); print ok or "
                          "the first error").set_defaults(run=cmd_check)
    source_cmd("ir", "print the checked IR, before generics are bound", specializes=False).set_defaults(run=cmd_ir)

    sub.add_parser("cards", help="list the model cards: size, source, and where their weights were found") \
        .set_defaults(run=cmd_cards)

    g = sub.add_parser("generate", help="generate text from a prompt, printed as it comes",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=GENERATE_EXAMPLES)
    g.add_argument("card", help="a card name (see `linnet cards`), a .linnet file, or a local HF dir or .gguf file")
    g.add_argument("prompt", help="the prompt; - reads it from standard input (linnet generate CARD - < FILE), less "
                                  "its final newline")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--system", help="a system message (with --chat; llama-cli's -sys, --system-prompt)")
    g.add_argument("--chat-template", default=None,
                   help="a Jinja chat template (a file, or the template itself) in place of the tokenizer's")
    g.add_argument("--max-new-tokens", type=_new_tokens, default=256,
                   help="most tokens to generate (256; -1: until the context is full; llama-cli's -n, --n-predict; "
                        "vLLM's max_tokens, --max-tokens)")
    g.add_argument("--temperature", type=_temperature, default=0.0, help="0 (the default) is greedy (llama-cli's --temp)")
    g.add_argument("--top-p", type=_top_p, default=1.0, help="sample from the likeliest tokens whose probabilities "
                   "add up to this (1, the default: from all)")
    g.add_argument("--top-k", type=_top_k, default=0,
                   help="sample from this many likeliest tokens (0, the default, as vLLM's: from all; llama-cli's is 40)")
    g.add_argument("--min-p", type=_min_p, default=0.0,
                   help="drop tokens less likely than this fraction of the likeliest one's probability (0: none)")
    g.add_argument("--repetition-penalty", type=_penalty, default=1.0,
                   help="divide the positive logits (multiply the negative) of tokens already in the prompt or "
                        "output by this, as vLLM's and transformers' (1, the default: none; llama-cli's "
                        "--repeat-penalty)")
    g.add_argument("--presence-penalty", type=_sampling_flag("presence_penalty"), default=0.0,
                   help="subtract this from the logits of tokens already in the output (0, the default: none)")
    g.add_argument("--frequency-penalty", type=_sampling_flag("frequency_penalty"), default=0.0,
                   help="subtract this times each token's count in the output from its logit (0, the default: none)")
    g.add_argument("--ignore-eos", action="store_true", help="go on past the model's end token, to --max-new-tokens")
    g.add_argument("--seed", type=_run_seed, default=None,
                   help="seeds the draws of a sampled run (default: a fixed seed, so that a run repeats, as vLLM's "
                        "default seed 0 has it; -1: a random one; llama-cli's -s)")
    g.add_argument("--stop", action="append", type=_stop_text, metavar="TEXT",
                   help="end the output before this text where it appears (repeatable; vLLM's stop)")
    g.add_argument("--backend", choices=["torch", "jax"], default="torch", help="(torch)")
    g.add_argument("--weights", type=_named,
                   help='a model directory, a .gguf file, or "random" (default: found as nest.load does)')
    g.add_argument("--device", type=_named, help="cpu, cuda, cuda:1, ... (default: cuda if there is one)")
    g.add_argument("--tokenizer", type=_named, default=None,
                   help="a model directory or .gguf file whose tokenizer to use (default: the weights' own)")
    g.add_argument("--numerics", choices=["exact", "fast"], default="fast",
                   help="fast (the default, as `serve`): packed weights, fused attention, T's weights and cache; "
                        "exact: the reference semantics, in f32")
    g.add_argument("--dtype", type=_dtype_name, choices=["f32", "bf16", "f16"], default=None,
                   help="T with --numerics fast (default bf16; exact always computes in f32; vLLM's bfloat16, "
                        "float16, half, float32 and auto are taken too)")
    g.add_argument("--quantization", "-q", type=_quantization, default=None, help=_QUANTIZATION_HELP)
    g.add_argument("--max-seq", type=_max_seq, default=None,
                   help="positions in the cache: prompt plus completion (default: the model's context, cut to what "
                        "memory holds and, on a CPU, to a 4 GiB cache, VLLM_CPU_KVCACHE_SPACE's GiB where set; "
                        "llama-cli's -c, --ctx-size, whose 0 is that default)")
    g.add_argument("--json-schema", "-j", default=None,
                   help="hold the output to a JSON schema (its text, or a file); '{\"type\": \"object\"}' for any object")
    g.add_argument("--regex", default=None, help="hold the output to a regular expression")
    g.add_argument("--grammar", "--grammar-file", default=None,
                   help="hold the output to a grammar, Lark or llama.cpp's GBNF (its text, or a file)")
    _add_compile_cache(g)
    # llama-cli's spellings (and vLLM's max_tokens), each its own flag so that an error names the one typed
    for dest, kind, flags in (("system", str, ["-sys", "--system-prompt"]),
                              ("max_new_tokens", _new_tokens, ["-n", "--n-predict", "--max-tokens"]),
                              ("temperature", _temperature, ["--temp"]), ("repetition_penalty", _penalty, ["--repeat-penalty"]),
                              ("seed", _run_seed, ["-s"]), ("max_seq", _ctx_size, ["-c", "--ctx-size"])):
        for flag in flags:
            g.add_argument(flag, dest=dest, type=kind, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    g.add_argument("--no-conversation", "-no-cnv", "--single-turn", "-st", action="store_true",
                   help="taken as it is: llama-cli's one-shot modes, what generate does (one prompt, one answer)")
    add_refusals(g, GENERATE_REFUSED)
    g.set_defaults(run=cmd_generate)
    sv = sub.add_parser("serve", help="an OpenAI-compatible server (completions, chat completions, responses)",
                        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=SERVE_EXAMPLES)
    sv.add_argument("card", help="a card name (see `linnet cards`), a .linnet file, or a checkpoint path")
    # vLLM's spellings are taken too, so that a vLLM command line needs only its first word changed.
    sv.add_argument("--batch", "--max-num-seqs", type=_positive, default=8, help="cache rows: requests in flight (8)")
    sv.add_argument("--max-seq", "--max-model-len", type=_max_seq, default=None,
                    help="positions per row: prompt plus completion (default, or auto: the model's context, cut to "
                         "what --batch rows fit in half the memory the weights leave free and, on a CPU, in "
                         "VLLM_CPU_KVCACHE_SPACE GiB, 4 unset, as vLLM's)")
    sv.add_argument("--backend", choices=["torch", "jax"], default="torch", help="(torch)")
    sv.add_argument("--device", type=_named, default=None, help="torch device (default: cuda when present)")
    sv.add_argument("--dtype", type=_dtype_name, choices=["f32", "bf16", "f16"], default=None,
                    help="the element type T of weights and cache with --numerics fast (default bf16; as `generate`'s; "
                         "vLLM's auto, bfloat16, float16, half and float32 are taken too)")
    sv.add_argument("--numerics", choices=["exact", "fast"], default="fast",
                    help="fast (the default): packed weights, fused attention, T's weights and cache; exact: the "
                         "reference semantics, in f32 (as `generate`'s)")
    sv.add_argument("--weights", type=_named, default=None,
                    help="a checkpoint path, or 'random' (default: the card's, found as nest.load finds them)")
    sv.add_argument("--quantization", "-q", type=_quantization, default=None, help=_QUANTIZATION_HELP)
    sv.add_argument("--token-budget", "--max-num-batched-tokens", type=_positive, default=None,
                    help="most tokens in one pass (default: 2048 on a GPU, 512 on a CPU)")
    sv.add_argument("--chat-template", default=None,
                    help="a Jinja chat template (a file, or the template itself) in place of the tokenizer's")
    sv.add_argument("--tokenizer", type=_named, default=None,
                    help="a model directory or .gguf file whose tokenizer to use (default: the weights' own)")
    sv.add_argument("--shards", "--tensor-parallel-size", "-tp", type=_positive, default=None,
                    help="jax: spread the model over this many devices (tensor parallel; 1, one device, "
                         "is taken with torch too)")
    sv.add_argument("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1: this machine "
                    "only; 0.0.0.0: every interface)")
    sv.add_argument("--port", type=_port, default=8000, help="default: 8000")
    sv.add_argument("--ssl-keyfile", default=None, help="serve HTTPS: the private key's PEM file (with --ssl-certfile)")
    sv.add_argument("--ssl-certfile", default=None, help="serve HTTPS: the certificate chain's PEM file")
    sv.add_argument("--name", "--served-model-name", nargs="+", default=None,
                    help="the model name clients send (default: the card as typed, where it is a repository id or a "
                         "checkpoint's path, and the card's name); more than one, as vLLM takes them: any is taken, "
                         "and replies give the first")
    sv.add_argument("--api-key", default=None,
                    help="require 'Authorization: Bearer KEY' on /v1/ routes (default: $LINNET_API_KEY, else vLLM's "
                         "$VLLM_API_KEY, else none)")
    for flag, what in (("origins", "origins whose web pages may call the server (CORS)"),
                       ("methods", "methods they may use"), ("headers", "headers they may send")):
        sv.add_argument(f"--allowed-{flag}", type=_cors_list, default=["*"],
                        help=f"{what}: a JSON list, as vLLM takes it, or commas (default: [\"*\"], any)")
    sv.add_argument("--allow-credentials", action="store_true",
                    help="let those pages send cookies and credentials (CORS; each origin is then named)")
    sv.add_argument("--tool-call-parser", choices=sorted(PARSERS), default=None,
                    help="how the model writes tool calls, for tool_choice 'auto' (default: the one its chat "
                         "template shows (Qwen3-Coder's XML), else the card's meta tool_call_parser; without one, "
                         "'auto' is refused)")
    sv.add_argument("--reasoning-parser", choices=sorted(REASONING), default=None,
                    help="how a reasoning model marks its thinking, which chat replies then give apart as "
                         "reasoning_content (default: the card's meta reasoning_parser)")
    sv.add_argument("--structured-outputs-in-reasoning", action="store_true",
                    help="a structured output holds a reasoning model's thinking too, not just its answer "
                         "(vLLM's structured_outputs_config.enable_in_reasoning)")
    sv.add_argument("--enable-auto-tool-choice", action="store_true",
                    help="vLLM's flag, taken as it is: 'auto' is on wherever a tool-call parser is known")
    sv.add_argument("--trust-request-chat-template", action="store_true",
                    help="let a chat request bring its own 'chat_template' (rendered sandboxed, in a worker "
                         "process held to 5 s and 512 MiB; refused otherwise)")
    sv.add_argument("--generation-config", type=_generation_config, default="auto", metavar="auto|vllm|FOLDER",
                    help="auto: a request that sets no temperature, top_p, top_k, min_p, repetition_penalty or "
                         "max_tokens takes the model's generation_config.json's, as vLLM's does; vllm: the "
                         "API's own defaults; a folder: its generation_config.json's (auto)")
    sv.add_argument("--override-generation-config", type=_generation_override, default=None, metavar="JSON",
                    help="generation config fields over those (vLLM's): '{\"temperature\": 0.5}'; a null "
                         "leaves that field the API's default")
    sv.add_argument("--stored-responses", type=_nonnegative, default=1024,
                    help="how many Responses (/v1/responses) are kept in memory for previous_response_id and "
                         "GET /v1/responses/ID, the oldest dropped first (0: none; 1024)")
    sv.add_argument("--seed", type=_seed, default=0,
                    help="seeds the draws of requests that send no seed of their own (0, as vLLM's)")
    sv.add_argument("--max-logprobs", type=_max_logprobs, default=MAX_LOGPROBS,
                    help="the most logprobs a request may ask for with each token (logprobs, top_logprobs, "
                         "prompt_logprobs); more is a 400, as vLLM's (%(default)s)")
    sv.add_argument("--shutdown-timeout", type=_seconds, default=0.0, metavar="SECONDS",
                    help="on SIGTERM or Ctrl-C, how long the requests in flight may go on before each is ended with "
                         "a 503 (0, as vLLM's: at once; a second signal ends them too); no new request is taken")
    _add_compile_cache(sv)
    sv.add_argument("--enforce-eager", action="store_true",
                    help="run every step eagerly: no CUDA graph, no CPU graph replay, no compiled model")
    sv.add_argument("--uvicorn-log-level", default="info",
                    choices=["critical", "error", "warning", "info", "debug", "trace"],
                    help="how much uvicorn, the HTTP server, logs (info: a line for each request, as vLLM's)")
    sv.add_argument("--disable-uvicorn-access-log", action="store_true",
                    help="no log line for each request (as vLLM's)")
    # vLLM's flags that mean nothing here: taken, so that a vLLM command line runs as it is
    sv.add_argument("--gpu-memory-utilization", type=_fraction, default=None,
                    help="vLLM sizes its cache by this; Linnet's cache is --batch rows of --max-seq positions, "
                         "so it is taken and has no effect")
    sv.add_argument("--kv-cache-dtype", choices=["auto"], default="auto",
                    help="the cache is held in the model's type T (--dtype)")
    for flag, why in (("--trust-remote-code", "Linnet runs no code from a checkpoint"),
                      ("--enable-prefix-caching", "requests sharing a prompt's prefix always share its cache"),
                      ("--disable-log-requests", "Linnet logs no request's content"),
                      ("--disable-log-stats", "Linnet logs no periodic statistics (/metrics serves them)"),
                      ("--enable-chunked-prefill", "a prompt longer than --token-budget is always prefilled in "
                                                   "chunks")):
        sv.add_argument(flag, action="store_true", help=f"taken as it is: {why}")
    for flag, kind, why in (("--swap-space", float, "no request's cache is swapped out to the CPU"),
                            ("--block-size", _positive, "a request's cache is one row of --max-seq positions, not "
                                                        "blocks"),
                            ("--load-format", str, "safetensors and GGUF are read as they are found")):
        sv.add_argument(flag, type=kind, default=None, help=f"taken and has no effect: {why}")
    add_refusals(sv, SERVE_REFUSED)
    sv.set_defaults(run=cmd_serve)
    ex = sub.add_parser("export", help="write a card with its weights for vLLM, llama.cpp or Triton Inference Server",
                        description="vllm: a Hugging Face model directory (config.json, safetensors, tokenizer). "
                                    "llama.cpp: one GGUF file (Llama, Mistral without a window, Mixtral, Qwen2, Qwen3, "
                                    "Qwen3-MoE, gpt-oss, Gemma 3, OLMo 2, Granite, Phi-3 (its window written, with a "
                                    "warning: llama.cpp runs it off), SmolLM3, "
                                    "Gemma 2, Phi-2, GPT-2, DeepSeek-V2 or DeepSeek-V3). "
                                    "triton: a model repository "
                                    "whose Python backend runs the card on Linnet's engine (the weights stay "
                                    "where they are).")
    ex.add_argument("card", help="a card name, a .linnet file, or a checkpoint path")
    ex.add_argument("--to", required=True, choices=["vllm", "llama.cpp", "triton"],
                    help="the server it is for: vllm, a Hugging Face model directory; llama.cpp, a GGUF; triton, a "
                         "model repository")
    ex.add_argument("-o", "--output", type=_named, required=True,
                    help="vllm: the model directory; llama.cpp: the .gguf file or a directory for it; "
                         "triton: the model repository")
    ex.add_argument("--weights", type=_named, default=None, help="a checkpoint path, or 'random' (default: the card's)")
    ex.add_argument("--dtype", type=_export_dtype, choices=["bf16", "f16", "f32", "q8_0"], default="bf16",
                    help="the type the weights are written in (bf16; vLLM's bfloat16, float16, half, float32 and "
                         "auto are taken too; q8_0, llama.cpp only: matrices in Q8_0 blocks, as llama.cpp's "
                         "converter's --outtype q8_0)")
    ex.add_argument("--tokenizer", type=_named, default=None,
                    help="a model directory or GGUF whose tokenizer to write, or for triton to serve with "
                         "(default: the weights' own; random weights take the card's own weights' tokenizer, "
                         "where they are found)")
    ex.add_argument("--seed", type=_seed, default=None, help="seeds --weights random (0); refused with other weights")
    # triton's own: None where not given, so that another target can say they mean nothing to it
    ex.add_argument("--name", type=_named, default=None, help="triton: the model's name (default: the card's)")
    ex.add_argument("--batch", type=_positive, default=None, help="triton: cache rows, the requests in flight (32)")
    ex.add_argument("--max-seq", type=_positive, default=None,
                    help="triton: positions per row (4096, or as many as a learned position table holds where "
                         "fewer: GPT-2's 1024)")
    ex.add_argument("--backend", choices=["torch", "jax"], default=None, help="triton: the backend Linnet runs (torch)")
    add_refusals(ex, EXPORT_REFUSED)
    ex.set_defaults(run=cmd_export)
    for command in sub.choices.values():  # what _run finds wrong with a command's flags, it reports as argparse would
        command.set_defaults(parser=command)
    return p


def _warning_line(message, category, filename, lineno, line=None) -> str:
    """A warning as the command line shows it: one line of what, not which line of Linnet said so."""
    from linnet.errors import LinnetWarning

    text = str(message)
    if issubclass(category, LinnetWarning):
        return text + "\n"  # `path:line:col: warning: ...` and its caret, as a compiler prints it
    return f"linnet: warning: {text.removeprefix('linnet: ')}\n"  # (a library's own warning may name it already)


def main(argv: list[str] | None = None) -> int:
    import warnings

    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # told by the subcommand's parser, whose usage it is (argparse's own names only `linnet`)
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    shown = warnings.formatwarning
    warnings.formatwarning = _warning_line
    try:
        return _run(args)
    finally:
        warnings.formatwarning = shown  # a caller's own (main in a test, say) comes back


def _run(args) -> int:
    """A parsed command run, its errors printed as one line each (or as source errors with a caret)."""
    from linnet.export import ExportError
    from linnet.kernels.build import KernelSettingError
    from linnet.nest.errors import CardError, DeviceError, TokenizerError, WeightsError
    from linnet.serve.request import EngineSettingError, RequestError

    try:
        return args.run(args)
    except _FlagError as err:
        args.parser.error(str(err))  # exits with status 2, as for a flag argparse refuses
    except LinnetError as err:
        print(err.render(), file=sys.stderr)
        return 1
    except DeviceError as err:
        print(f"linnet: error: {_as_flags(str(err))}", file=sys.stderr)
        return 1
    except (CardError, WeightsError, TokenizerError, RequestError, EngineSettingError, ExportError,
            KernelSettingError, _UsageError) as err:
        print(f"linnet: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`| head`): quiet, as coreutils end then
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python's flush at exit would fail again)
        return 141  # 128 + SIGPIPE, what a shell reports for them
    except OSError as err:  # a file the user named that cannot be written or read (-o into no folder, say)
        where = f"{err.filename}: " if err.filename else ""
        print(f"linnet: error: {where}{err.strerror or err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
