"""A stand-in for Anthropic's Messages API, enough for Claude Code to run one scripted turn.

Claude Code (``ANTHROPIC_BASE_URL`` pointed here) asks for the model's answer; the stand-in
answers with a script of tool calls — ``Read`` a file, then ``Bash`` ``cat`` of it, then a
closing text — streamed as the real API streams them (server-sent events) or as one JSON
message, and records every request it was sent: what the model would have seen.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

READ_ID = "toolu_standin_read"
BASH_ID = "toolu_standin_bash"


def tool_results(request: dict[str, Any]) -> dict[str, str]:
    """Every tool result in a request's messages: tool_use_id → its text."""
    found = {}
    for message in request.get("messages", []):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    inner = "\n".join(str(b.get("text", "")) for b in inner if isinstance(b, dict))
                found[str(block.get("tool_use_id"))] = str(inner)
    return found


class StandIn:
    """The scripted model, on ``127.0.0.1:{port}``; ``requests`` holds every request body."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(size)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {"unreadable": raw.decode("utf-8", "replace")}
                with standin.lock:
                    standin.requests.append({"path": self.path, "body": body})
                if "/count_tokens" in self.path:
                    return self._json({"input_tokens": 42})
                if "/v1/messages" not in self.path:
                    return self._json({"type": "error", "error": {"type": "not_found_error",
                                       "message": self.path}}, 404)  # fmt: skip
                message = standin.answer(body)
                if body.get("stream"):
                    return self._stream(message)
                return self._json(message)

            def _json(self, value: Any, status: int = 200) -> None:
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, message: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.end_headers()
                for event in sse(message):
                    self.wfile.write(event)
                    self.wfile.flush()
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The script: the agent's loop (a request offering the Read tool) gets Read, then
        Bash, then a closing text; any other request (a title, a summary) gets a short text."""
        tools = {t.get("name") for t in body.get("tools", []) if isinstance(t, dict)}
        if "Read" not in tools:
            return message([{"type": "text", "text": "Config check"}], "end_turn")
        done = tool_results(body)
        if READ_ID not in done:
            call = {"type": "tool_use", "id": READ_ID, "name": "Read",
                    "input": {"file_path": self.path}}  # fmt: skip
            return message([call], "tool_use")
        if BASH_ID not in done:
            command = {"command": f"cat {self.path}", "description": "Show the file"}
            call = {"type": "tool_use", "id": BASH_ID, "name": "Bash", "input": command}
            return message([call], "tool_use")
        return message([{"type": "text", "text": "The file holds four settings."}], "end_turn")


def message(content: list[dict[str, Any]], stop_reason: str) -> dict[str, Any]:
    return {
        "id": "msg_standin", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "content": content, "stop_reason": stop_reason,
        "stop_sequence": None, "usage": {"input_tokens": 42, "output_tokens": 7},
    }  # fmt: skip


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


def sse(whole: dict[str, Any]) -> list[bytes]:
    """``whole`` as the Messages API streams it."""
    start = {**whole, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": 42, "output_tokens": 1}
    events = [_event("message_start", {"message": start})]
    for i, block in enumerate(whole["content"]):
        if block["type"] == "text":
            first, delta = (
                {"type": "text", "text": ""},
                {"type": "text_delta", "text": block["text"]},
            )
        else:
            first = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events.append(_event("content_block_start", {"index": i, "content_block": first}))
        events.append(_event("content_block_delta", {"index": i, "delta": delta}))
        events.append(_event("content_block_stop", {"index": i}))
    events.append(
        _event(
            "message_delta",
            {
                "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": 7},
            },
        )
    )
    events.append(_event("message_stop", {}))
    return events
