"""Helpers for serving tests over real HTTP: a condition awaited with a deadline, a load of concurrent
searches kept running while the test changes something."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

QUERY = {"query": "When does the else clause of a for loop run?", "k": 5}


def wait_for(pred, timeout: float, what: str, step: float = 0.25):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    raise AssertionError(f"not within {timeout}s: {what}")


class Load:
    """`workers` threads sending searches until stopped; every response is kept for the asserts."""

    def __init__(self, url: str, headers: dict, workers: int = 4, body: dict | None = None, timeout: float = 60):
        self.url = url
        self.headers = headers
        self.body = body or QUERY
        self.timeout = timeout
        self.stop = threading.Event()
        self.responses: list[dict] = []
        self.pool = ThreadPoolExecutor(workers)
        self.futures = [self.pool.submit(self._run) for _ in range(workers)]

    def _run(self):
        with httpx.Client(base_url=self.url, timeout=self.timeout) as client:
            while not self.stop.is_set():
                started = time.time()
                try:
                    response = client.post("/v1/search", json=self.body, headers=self.headers)
                    body = response.json()
                    status = response.status_code
                except httpx.HTTPError as error:
                    body = {"error": type(error).__name__}
                    status = 0
                self.responses.append({"status": status, "body": body, "t0": started, "s": time.time() - started})

    def finish(self) -> list[dict]:
        self.stop.set()
        for future in self.futures:
            future.result()
        self.pool.shutdown()
        return self.responses
