"""The one fake in this suite: an OpenAI-compatible chat server (a hosted LLM API is an external service
we cannot run). A tiny real HTTP server (stdlib `ThreadingHTTPServer` on a free port, in a thread), so
clients' retries, headers, timeouts and the Ray actor pool are exercised exactly as against a real
endpoint. Its reply is a function of the messages: by default rule-based questions built from the words
of the text it is asked about (tests can check which chunk a question came from); the serving tests
plug in canned HyDE and answer replies. It reports `usage`, counts requests, and can be scripted to
fail (429/5xx with or without Retry-After, 401 without the right key) or to be slow.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator

_STOP = {"the", "and", "that", "with", "from", "this", "have", "into", "which", "their", "there", "about",
         "were", "what", "when", "where", "been", "also", "than", "then", "they", "them", "these", "those"}


def words_of(text: str) -> list[str]:
    """Content words (>= 4 letters, no stop words) in order of first appearance."""
    seen = set()
    out = []
    for word in re.findall(r"[A-Za-z][A-Za-z0-9-]{3,}", text):
        key = word.lower()
        if key not in _STOP and key not in seen:
            seen.add(key)
            out.append(word)
    return out


def rule_based_reply(messages: list[dict]) -> str:
    """Questions about the text the prompt asks about, numbered like a small model would.

    The subject text is the atom after "The answer should be present in:" for atom prompts, else the
    last user message (the chunk for HyPE). The count is the number after "exactly"/"Generate", default 3.
    """
    last_user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
    prompt_text = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") in ("system", "user"))
    subject = last_user.split("The answer should be present in:\n")[-1]
    match = re.search(r"(?:exactly|Generate)\s+(\d+)", prompt_text.split("The answer should be present in:")[0][-400:])
    count = int(match.group(1)) if match else (1 if "a single" in last_user else 3)
    words = words_of(subject) or ["nothing"]
    lines = [f"{i + 1}. What does the text say about {words[i % len(words)]}?" for i in range(count)]
    return "\n".join(lines) + "\n"


class FakeOpenAI:
    """State + knobs of the fake server (thread-safe; handler threads update it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.chat_requests = 0  # POST /chat/completions received (including scripted failures)
            self.model_requests = 0  # GET /models
            self.bodies: list[dict] = []
            self.auth_headers: list[str | None] = []
            self.failures: deque[tuple[int, dict]] = deque()  # (status, headers) for the next requests
            self.require_key: str | None = None
            self.delay_s = 0.0
            self.inflight = 0
            self.max_inflight = 0
            self.reply = rule_based_reply  # messages -> text
            self.model_name = "fake-model"

    # convenience for tests
    def fail_next(self, *statuses: int, retry_after: str | None = None) -> None:
        with self.lock:
            for status in statuses:
                self.failures.append((status, {"Retry-After": retry_after} if retry_after is not None else {}))

    @property
    def url(self) -> str:
        return self.base_url

    def user_texts(self) -> list[str]:
        """The last user message of every chat request received so far."""
        with self.lock:
            return [next((m["content"] for m in reversed(b.get("messages", [])) if m["role"] == "user"), "")
                    for b in self.bodies]


def _make_handler(state: FakeOpenAI):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep pytest output clean
            pass

        def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
            self._done()  # before the reply leaves: a client may send its next request the moment it has it
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _done(self) -> None:
            """This request stops counting as in flight (once)."""
            if getattr(self, "_counted", False):
                self._counted = False
                with state.lock:
                    state.inflight -= 1

        def _authorized(self) -> bool:
            want = state.require_key
            return want is None or self.headers.get("Authorization") == f"Bearer {want}"

        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/v1/models":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            with state.lock:
                state.model_requests += 1
            if not self._authorized():
                self._send(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
                return
            self._send(200, {"object": "list", "data": [{"id": state.model_name, "object": "model"}]})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, {"error": {"message": "body is not JSON"}})
                return
            with state.lock:
                state.chat_requests += 1
                state.bodies.append(body)
                state.auth_headers.append(self.headers.get("Authorization"))
                failure = state.failures.popleft() if state.failures else None
                state.inflight += 1
                state.max_inflight = max(state.max_inflight, state.inflight)
                self._counted = True
                delay = state.delay_s
            try:
                if delay:
                    time.sleep(delay)
                if not self._authorized():
                    self._send(401, {"error": {"message": "Incorrect API key provided",
                                               "type": "invalid_request_error"}})
                    return
                if failure is not None:
                    status, headers = failure
                    self._send(status, {"error": {"message": f"scripted failure {status}"}}, headers)
                    return
                count = int(body.get("n") or 1)
                texts = [state.reply(body["messages"]) for _ in range(count)]
                prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
                completion_tokens = sum(len(t.split()) for t in texts)
                self._send(200, {
                    "id": f"chatcmpl-{state.chat_requests}", "object": "chat.completion",
                    "model": body.get("model"),
                    "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
                                for i, t in enumerate(texts)],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                              "total_tokens": prompt_tokens + completion_tokens},
                })
            finally:
                self._done()

    return Handler


@contextlib.contextmanager
def running_fake_openai(reply: Callable[[list[dict]], str] | None = None, port: int = 0) -> Iterator[FakeOpenAI]:
    """A running fake server (on `port`, default a free one); `.base_url` (= `.url`) ends in /v1. Stopped
    on exit."""
    state = FakeOpenAI()
    if reply is not None:
        state.reply = reply
    server = ThreadingHTTPServer(("127.0.0.1", port), _make_handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai",
                              daemon=True)
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
