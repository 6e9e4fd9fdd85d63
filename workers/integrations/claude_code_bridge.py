"""``hookbus-claude-code``: a Claude Code command hook that asks ``hookbus gateway``.

For setups that allow only ``command`` hooks. Claude Code starts it once per hook call with its
hook input on stdin; it posts that input to the gateway's ``/claude-code`` and prints the answer
(Claude Code's hook output JSON) on stdout. Configured by the environment Claude Code hands its
hooks:

``HOOKBUS_GATEWAY_URL``
    the gateway, ``http://HOST:PORT`` (default ``http://127.0.0.1:8787``; a path is kept as a
    prefix of ``/claude-code``). Plain HTTP: keep the gateway on the same host or network, or put
    TLS in front of it and use Claude Code's ``http`` hook type.
``HOOKBUS_GATEWAY_TOKEN``
    the bearer token (``hookbus gateway --new-token TENANT``).
``HOOKBUS_GATEWAY_TIMEOUT``
    seconds to wait for the answer (default 35: the gateway's own 30, and some).

Exit status, as Claude Code reads it: 0 with the gateway's answer; when no answer can be had
(the gateway is down, refuses the token, times out), 2 — a blocking error, the reason on stderr
— for the events that gate a tool (PreToolUse, PermissionRequest): HookBus never approves what
it could not inspect; 1 (a non-blocking error) for the other events.

It starts fast because it imports nothing but ``os``, ``sys`` and ``_socket``: HTTP/1.1 is
written by hand here, on purpose. ``urllib``/``http.client`` and ``json`` cost more to import than
the whole exchange, and so does the ``socket`` module itself (it imports ``enum`` and
``selectors``, ~5 ms here), hence ``_socket``, the C module that ``socket`` wraps. The start-up
is measured in docs/integrations.md.
"""

import _socket
import os
import sys

DEFAULT_URL = "http://127.0.0.1:8787"
DEFAULT_TIMEOUT = 35.0
LIMIT = 1_048_576  # the gateway's default body limit: refuse larger input here, at once
GATING = ("PreToolUse", "PermissionRequest")


class Failed(Exception):
    """No answer could be had from the gateway."""


def event_name(data: bytes) -> str:
    """The input's ``hook_event_name``, found without a JSON parser (it is only used to choose
    how to fail)."""
    at = data.find(b'"hook_event_name"')
    if at < 0:
        return ""
    start = data.find(b'"', data.find(b":", at + 17) + 1)
    end = data.find(b'"', start + 1)
    return data[start + 1 : end].decode("utf-8", "replace") if 0 <= start < end else ""


def split_url(url: str) -> tuple[str, int, str]:
    """(host, port, path prefix) of ``http://host[:port][/prefix]``."""
    if not url.startswith("http://"):
        raise Failed(f"HOOKBUS_GATEWAY_URL must be http://HOST:PORT, not {url!r}")
    rest = url[len("http://") :]
    authority, slash, path = rest.partition("/")
    host, port = authority, "80"
    if authority.startswith("["):  # [::1]:8787
        host, _, after = authority[1:].partition("]")
        port = after[1:] if after.startswith(":") else "80"
    elif ":" in authority:
        host, _, port = authority.rpartition(":")
    if not host or not port.isdigit():
        raise Failed(f"HOOKBUS_GATEWAY_URL must be http://HOST:PORT, not {url!r}")
    return host, int(port), ("/" + path).rstrip("/") if slash else ""


def post(url: str, token: str, body: bytes, timeout: float) -> tuple[int, bytes]:
    """One ``POST …/claude-code`` over a new connection: (status, body)."""
    host, port, prefix = split_url(url)
    head = (
        f"POST {prefix}/claude-code HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    chunks = []
    try:
        conn = connect(host, port, timeout)
        try:
            conn.sendall(head.encode("latin-1") + body)
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        finally:
            conn.close()
    except OSError as exc:  # refused, unreachable, timed out
        raise Failed(f"no answer from the HookBus gateway at {url}: {exc}") from None
    return parse_response(b"".join(chunks))


def connect(host: str, port: int, timeout: float) -> "_socket.socket":
    """A connected TCP socket to the first address of ``host`` that answers (as
    ``socket.create_connection`` does)."""
    error: OSError = OSError(f"cannot resolve {host}")
    for family, kind, proto, _, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        conn = _socket.socket(family, kind, proto)
        try:
            conn.settimeout(timeout)
            conn.connect(address)
            return conn
        except OSError as exc:
            conn.close()
            error = exc
    raise error


def parse_response(raw: bytes) -> tuple[int, bytes]:
    head, sep, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if not sep or len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise Failed("the HookBus gateway's answer is not HTTP/1.1")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = dechunk(body)
    elif (length := headers.get(b"content-length", b"")).isdigit():
        if len(body) < int(length):
            raise Failed("the HookBus gateway's answer was cut short")
        body = body[: int(length)]
    return int(parts[1]), body


def dechunk(data: bytes) -> bytes:
    out, at = [], 0
    while True:
        end = data.find(b"\r\n", at)
        size = int(data[at:end].split(b";")[0] or b"0", 16) if end >= 0 else -1
        if size < 0 or end + 2 + size > len(data):
            raise Failed("the HookBus gateway's answer was cut short")
        if size == 0:
            return b"".join(out)
        out.append(data[end + 2 : end + 2 + size])
        at = end + 2 + size + 2


def main() -> int:
    data = sys.stdin.buffer.read(LIMIT + 1)
    event = event_name(data)
    env = os.environ
    try:
        if len(data) > LIMIT:
            raise Failed(f"the hook input is over {LIMIT} bytes")
        try:
            timeout = float(env.get("HOOKBUS_GATEWAY_TIMEOUT") or DEFAULT_TIMEOUT)
        except ValueError:
            raise Failed("HOOKBUS_GATEWAY_TIMEOUT must be a number of seconds") from None
        token = env.get("HOOKBUS_GATEWAY_TOKEN", "")
        if not token:
            raise Failed("HOOKBUS_GATEWAY_TOKEN is not set")
        status, answer = post(env.get("HOOKBUS_GATEWAY_URL") or DEFAULT_URL, token, data, timeout)
        if status != 200:
            said = answer.decode("utf-8", "replace")[:500]
            raise Failed(f"the HookBus gateway answered {status}: {said}")
    except Failed as exc:
        if event in GATING:
            print(f"HookBus: {exc}; blocked, since nothing could inspect it", file=sys.stderr)
            return 2
        print(f"HookBus: {exc}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
