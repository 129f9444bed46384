"""A fake Vertex AI `generateContent` endpoint for tests and the local stack.

It serves what `google-genai` in Vertex mode sends (`vertexai=True`, `project`, `location`):
`POST /{v1|v1beta1}/projects/{p}/locations/{l}/publishers/google/models/{model}:generateContent`
(https://docs.cloud.google.com/vertex-ai/generative-ai/docs/model-reference/inference). The
answer is the first fixture whose key occurs in the prompt's text, as one candidate part of
JSON text, with `usageMetadata` token counts (promptTokenCount, candidatesTokenCount,
totalTokenCount). Faults are queued and served one per call, in order, before any fixture:
`bad_schema` (an answer that breaks the caller's schema), `429` (`RESOURCE_EXHAUSTED`) and
`400` (`INVALID_ARGUMENT`), shaped like Google's error model
(https://docs.cloud.google.com/vertex-ai/generative-ai/docs/model-reference/api-errors).

Every call is counted and kept (`calls`), so a test asserts how many reached "the model".
No authentication is checked beyond the presence of a bearer token: the client under test
sends a static one, and nothing reaches Google.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from devstack.serving import serve_in_thread
from shared.blocks import answer_schema

GENERATE = re.compile(
    r"^/v1(?:beta1)?/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
    r"/publishers/google/models/(?P<model>[^/:]+):generateContent$"
)
Fault = Literal["bad_schema", "429", "400"]
BAD_ANSWER: dict[str, Any] = {"unexpected": "this answer breaks the schema"}


@dataclass(frozen=True)
class Call:
    project: str
    location: str
    model: str
    prompt: str
    body: dict[str, Any]


@dataclass
class FakeVertex:
    host: str = "127.0.0.1"
    port: int = 0
    # prompt substring -> the JSON answer the model gives for it.
    fixtures: dict[str, Any] = field(default_factory=dict)
    default_answer: Any = None
    faults: list[Fault] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    # Run on each call before it is answered (a test looks at what was committed before the
    # request left: the charge and the reservation).
    on_call: Callable[[], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://{self.host}:{self._server.server_address[1]}"

    def start(self) -> FakeVertex:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                ok = self.path == "/_admin/health"
                self.send_response(200 if ok else 404)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                status, body = fake.handle(self.path, self.headers.get("authorization"), raw)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json; charset=UTF-8")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        serve_in_thread(self._server, "fakevertex")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def call_count(self) -> int:
        with self._lock:
            return len(self.calls)

    def handle(self, path: str, authorization: str | None, raw: bytes) -> tuple[int, Any]:
        match = GENERATE.match(path.split("?", 1)[0])
        if match is None:
            return 404, _error(404, "NOT_FOUND", f"no such method {path}")
        if not authorization or not authorization.startswith("Bearer "):
            return 401, _error(401, "UNAUTHENTICATED", "missing bearer token")
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return 400, _error(400, "INVALID_ARGUMENT", "body is not JSON")
        prompt = "".join(
            str(part.get("text", ""))
            for content in body.get("contents", [])
            for part in content.get("parts", [])
        )
        with self._lock:
            self.calls.append(Call(**match.groupdict(), prompt=prompt, body=body))
            fault = self.faults.pop(0) if self.faults else None
        if self.on_call is not None:
            self.on_call()
        if fault == "429":
            return 429, _error(
                429, "RESOURCE_EXHAUSTED", "Resource exhausted, please try again later."
            )
        if fault == "400":
            return 400, _error(400, "INVALID_ARGUMENT", "Request contains an invalid argument.")
        answer = BAD_ANSWER if fault == "bad_schema" else self._answer(prompt, body)
        text = json.dumps(answer)
        prompt_tokens, answer_tokens = _tokens(prompt), _tokens(text)
        return 200, {
            "candidates": [
                {
                    "content": {"role": "model", "parts": [{"text": text}]},
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": {
                "promptTokenCount": prompt_tokens,
                "candidatesTokenCount": answer_tokens,
                "totalTokenCount": prompt_tokens + answer_tokens,
            },
            "modelVersion": match["model"],
        }

    def _answer(self, prompt: str, body: dict[str, Any]) -> Any:
        """The first fixture whose key is in the prompt; else `default_answer`; else the
        smallest answer the requested schema allows (so the local stack answers any
        workflow's AI step in the shape it asked for); else {}."""
        for key, answer in self.fixtures.items():
            if key in prompt:
                return answer
        if self.default_answer is not None:
            return self.default_answer
        schema = body.get("generationConfig", {}).get("responseJsonSchema")
        return answer_schema.example(schema) if isinstance(schema, dict) else {}


def _tokens(text: str) -> int:
    """A stand-in tokenizer (about four characters a token), stable for assertions."""
    return max(1, len(text) // 4)


def _error(code: int, status: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}
