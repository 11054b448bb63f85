"""`linnet serve` stopped by SIGTERM, as Kubernetes stops a pod: vLLM's --shutdown-timeout."""

import http.client
import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.serve.test_cli_serve import free_port, wait_until_healthy


def start_server(*flags):
    """tiny-llama served with random weights; rows long enough for a request that outlasts any test."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "linnet.cli", "serve", "tiny-llama", "--weights", "random",
                             "--batch", "4", "--max-seq", "32768", "--port", str(port), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_until_healthy(proc, f"http://127.0.0.1:{port}")
    return proc, port


def post(port: int, body: dict) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    # (tiny-llama has no tokenizer: logprobs give each streamed token a chunk of its own)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": [1, 2, 3], "ignore_eos": True, "logprobs": 1,
                                                        **body}), {"Content-Type": "application/json"})
    return conn


def streaming(port: int, max_tokens: int):
    """A stream's response, once its first token has come: in flight."""
    reply = post(port, {"max_tokens": max_tokens, "stream": True}).getresponse()
    assert reply.status == 200 and reply.readline().startswith(b"data: {")
    return reply


def events(reply) -> list:
    return [line.removeprefix("data: ") for line in reply.read().decode().splitlines() if line.startswith("data: ")]


def stalled_body(port: int) -> socket.socket:
    """A client that sent its headers and a tenth of its body, then nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"prompt\"")
    return sock


def answer(sock: socket.socket) -> bytes:
    got = b""
    while chunk := sock.recv(4096):
        got += chunk
    return got


def refused_connection(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def is_shutdown_error(event: str) -> bool:
    return json.loads(event)["error"] == {"message": "the server is shutting down", "type": "server_error",
                                          "param": None, "code": "server_shutting_down"}


def test_sigterm_drains_for_the_shutdown_timeout_and_a_second_one_ends_the_rest():
    """With --shutdown-timeout, SIGTERM closes the port, lets a request in flight run to its end, and
    waits; a second SIGTERM ends what is left, each told why: a stream with an error event and [DONE],
    a client still sending its body with a 503. Then the server stops."""
    proc, port = start_server("--shutdown-timeout", "300")
    try:
        long = streaming(port, 30000)  # minutes of tokens
        short = streaming(port, 3000)  # seconds of tokens
        stalled = stalled_body(port)
        time.sleep(0.1)  # (its headers read: the server is answering it)
        proc.send_signal(signal.SIGTERM)
        time.sleep(1)  # (signals that arrive together count once)
        assert refused_connection(port)
        finished = events(short)
        assert finished[-1] == "[DONE]" and json.loads(finished[-2])["choices"][0]["finish_reason"] == "length"
        assert sum(json.loads(e)["choices"][0]["logprobs"] is not None for e in finished[:-1]) == 2999  # all but
        # the first, read above
        assert long.readline() and proc.poll() is None  # still streaming, well within the timeout
        proc.send_signal(signal.SIGTERM)
        ended = events(long)
        assert ended[-1] == "[DONE]" and is_shutdown_error(ended[-2])
        head, _, body = answer(stalled).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ") and b"connection: close" in head.lower()
        assert is_shutdown_error(body.decode())
        output = proc.communicate(timeout=30)[0]
    finally:
        proc.kill()
    assert "waiting up to 300 s for 3 request(s) in flight to finish" in output
    assert "ending 2 request(s) in flight: the server is shutting down" in output
    assert "Traceback" not in output and "Exception in ASGI application" not in output


@pytest.mark.parametrize("stream", [False, True])
def test_by_default_sigterm_ends_the_requests_in_flight_at_once(stream):
    """vLLM's default, --shutdown-timeout 0: SIGTERM answers each request in flight with the 503 its
    client can read (an unstreamed one as its body), rather than dropping its connection."""
    proc, port = start_server()
    try:
        if stream:
            reply = streaming(port, 30000)
        else:
            conn = post(port, {"max_tokens": 30000})
            for _ in range(300):  # until it holds a row
                metrics = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                metrics.request("GET", "/metrics")
                if 'vllm:num_requests_running{model_name="tiny-llama"} 1' in metrics.getresponse().read().decode():
                    break
                time.sleep(0.1)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        if stream:
            ended = events(reply)
            assert ended[-1] == "[DONE]" and is_shutdown_error(ended[-2])
        else:
            reply = conn.getresponse()
            assert reply.status == 503 and is_shutdown_error(reply.read().decode())
        output = proc.communicate(timeout=30)[0]
        assert time.monotonic() - start < 30
    finally:
        proc.kill()
    assert "ending 1 request(s) in flight: the server is shutting down" in output
    assert "Traceback" not in output


def test_the_shutdown_timeout_is_a_number_of_seconds(capsys):
    from linnet.cli import main

    with pytest.raises(SystemExit, match="2"):
        main(["serve", "tiny-llama", "--weights", "random", "--shutdown-timeout", "-1"])
    assert "--shutdown-timeout: must be 0 or more seconds (inf: no limit), not -1.0" in capsys.readouterr().err
