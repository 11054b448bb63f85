"""Cross-origin requests (CORS), so that a web page on another origin (a chat UI in a browser) may
call the server. vLLM's flags and defaults: any origin, any method, any header, no credentials.

A browser asks first with a preflight (OPTIONS, naming the method and headers it means to send);
the answer says what is allowed. Every later answer to that origin names it as allowed, or the
browser hides the answer from the page. Requests without an Origin header (curl, SDKs) are not
cross-origin and are answered as they always are.
"""

from __future__ import annotations

ANY = "*"
METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
MAX_AGE = 600  # seconds a browser may keep a preflight's answer
# Headers always allowed, whatever --allowed-headers names (as Starlette's CORSMiddleware, vLLM's, adds
# them): a page's JSON POST asks for content-type in its preflight
ALWAYS_ALLOWED_HEADERS = ("accept", "accept-language", "content-language", "content-type")


class CorsPolicy:
    def __init__(self, origins=(ANY,), methods=(ANY,), headers=(ANY,), credentials: bool = False):
        self.origins = tuple(origins)
        self.methods = METHODS if ANY in methods else tuple(m.upper() for m in methods)
        self.headers = tuple(dict.fromkeys(h.lower() for h in (*headers, *ALWAYS_ALLOWED_HEADERS)))
        self.credentials = credentials

    def allows(self, origin: str) -> bool:
        return ANY in self.origins or origin in self.origins

    def _origin_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        # With credentials a browser refuses "*": the origin itself is named, and the answer varies by it
        if ANY in self.origins and not self.credentials:
            named = [(b"access-control-allow-origin", b"*")]
        else:
            named = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
        if self.credentials:
            named.append((b"access-control-allow-credentials", b"true"))
        return named

    def preflight(self, origin: str, method: str, asked_headers: str) -> tuple[int, list, str]:
        """(status, headers, refusal) for an OPTIONS preflight from `origin` asking for `method`
        with `asked_headers` (the Access-Control-Request-Headers list); refusal is "" when allowed."""
        asked = [h.strip().lower() for h in asked_headers.split(",") if h.strip()]
        refused = []
        if not self.allows(origin):
            refused.append(f"origin {origin!r}")
        if method.upper() not in self.methods:
            refused.append(f"method {method!r}")
        if ANY not in self.headers:
            refused += [f"header {h!r}" for h in asked if h not in self.headers]
        allow_headers = asked_headers if ANY in self.headers else ", ".join(self.headers)
        headers = [*self._origin_headers(origin), (b"access-control-allow-methods", ", ".join(self.methods).encode()),
                   (b"access-control-max-age", str(MAX_AGE).encode())]
        if allow_headers:
            headers.append((b"access-control-allow-headers", allow_headers.encode("latin-1")))
        if refused:
            return 400, [h for h in headers if h[0] == b"vary"], "CORS: not allowed: " + ", ".join(refused)
        return 200, headers, ""

    def answer_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        """What an answer to a request from `origin` adds: the origin named allowed, or nothing."""
        return self._origin_headers(origin) if self.allows(origin) else []


def parse_list(text: str) -> list[str]:
    """A flag's list: vLLM's JSON form ('["https://a.example", "https://b.example"]') or plain commas."""
    import json

    text = text.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError as err:
            raise ValueError(f"{text!r} is not a JSON list: {err}") from None
        if not all(isinstance(i, str) for i in items):
            raise ValueError(f"{text!r}: every item must be a string")
        return items
    return [item.strip() for item in text.split(",") if item.strip()]
