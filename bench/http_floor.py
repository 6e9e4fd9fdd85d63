"""The HTTP floor of ``bench.http_gateway``: a hand-written Starlette endpoint, no HookBus.

``python -m bench.http_floor PORT`` serves ``POST /v1/decisions`` on uvicorn with the gateway's
settings (httptools, no access log, no server header): it reads the body, decodes the JSON,
checks a bearer token with ``hmac.compare_digest`` and answers a reply of a ``DecisionReply``'s
size that echoes the request's id. What is left of the gateway's time beyond this is HookBus:
the protocol checks, the dispatch to the hook service over Redis, the aggregation.
"""

from __future__ import annotations

import hmac
import sys
from typing import Any

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

TOKEN = b"Bearer bench-floor-token"
RESULT = {
    "action": {"type": "Continue"}, "final_args": {"path": "src/app/main.py", "limit": 200},
    "additional_contexts": [], "blocking_errors": [], "tagged_contexts": [], "skipped": [],
    "shadowed": [],
}  # fmt: skip


async def decisions(request: Request) -> Response:
    if not hmac.compare_digest(request.headers.get("authorization", "").encode(), TOKEN):
        return Response(b'{"error":"unauthorized"}', 401, media_type="application/json")
    asked: Any = msgspec.json.decode(await request.body())
    reply = {
        "v": 1, "id": "0" * 32, "ts": 0, "traceparent": "", "tracestate": "",
        "request_id": asked["id"], "event": asked["event"], "status": "ok", "result": RESULT,
        "error": "", "field": "",
    }  # fmt: skip
    return Response(msgspec.json.encode(reply), media_type="application/json")


app = Starlette(routes=[Route("/v1/decisions", decisions, methods=["POST"])])


if __name__ == "__main__":
    uvicorn.run(
        app, host="127.0.0.1", port=int(sys.argv[1]), log_config=None, access_log=False,
        server_header=False,
    )  # fmt: skip
