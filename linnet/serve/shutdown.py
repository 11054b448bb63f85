"""How `linnet serve` stops on SIGTERM or Ctrl-C: vLLM's `--shutdown-timeout`.

uvicorn alone waits for every connection to close, however long that takes: a request
generating 100,000 tokens, or a client that stopped sending its body halfway, kept the server
up until it was killed, and a kill's requests got a bare 500 and a traceback each. Here the
server stops taking requests at the first signal (a request that still reaches it gets a 503),
lets those in flight finish for up to `timeout` seconds (0, vLLM's default: none), then ends the
rest, each answered with a 503 (a stream: an error event and its end) and its cache row freed.
A second signal ends them at once. Only where a client takes no answer (it reads nothing)
does the server stop without waiting for it, ABANDON_AFTER seconds later.
"""

from __future__ import annotations

import asyncio
import logging

import uvicorn

log = logging.getLogger("uvicorn.error")  # (told beside uvicorn's own lines on shutting down)
ABANDON_AFTER = 5.0  # seconds the requests being ended have to send their 503 before the server stops anyway
POLL = 0.1  # (as uvicorn's own shutdown polls its connections)


class DrainingServer(uvicorn.Server):
    """uvicorn's server over an `OpenAIServer` (`app`), shutting down as this module says."""

    def __init__(self, config: uvicorn.Config, app, timeout: float):
        super().__init__(config)
        self.app, self.timeout = app, timeout
        self.signals = 0
        self.hurry = False  # a second signal: end the requests in flight now

    def handle_exit(self, sig, frame) -> None:
        # Run by the signal handler, between two steps of the event loop: it only sets flags, which the
        # loop's tasks read. uvicorn's second Ctrl-C skips the drain and the lifespan's end (the engine's
        # stop); here the second signal of either kind ends the requests (each told why), and a third quits.
        self.signals += 1
        forced = self.force_exit
        super().handle_exit(sig, frame)
        if self.signals == 2:
            self.force_exit, self.hurry = forced, True
        elif self.signals > 2:
            self.force_exit = True

    async def shutdown(self, sockets=None) -> None:
        self.app.close()
        ender = asyncio.create_task(self._end_requests())
        try:
            await super().shutdown(sockets)
        finally:
            ender.cancel()

    async def _end_requests(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        if self.app.busy() and self.timeout > 0:
            log.info("waiting up to %g s for %d request(s) in flight to finish (a second signal ends them now)",
                     self.timeout, self.app.busy())
        while self.app.busy() and loop.time() < deadline and not self.hurry:
            await asyncio.sleep(POLL)
        if not self.app.busy():
            return
        log.info("ending %d request(s) in flight: the server is shutting down", self.app.busy())
        self.app.end_requests()
        abandon = loop.time() + ABANDON_AFTER
        while self.app.busy() and loop.time() < abandon:
            await asyncio.sleep(POLL)
        if self.app.busy():
            log.warning("%d client(s) took no answer in %g s; stopping without them", self.app.busy(), ABANDON_AFTER)
            self.force_exit = True
