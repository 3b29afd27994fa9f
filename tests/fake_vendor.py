"""A payment vendor that dedupes by idempotency key, in its own process, and its client.

The server (``python tests/fake_vendor.py PORT_FILE``) listens on 127.0.0.1 (a free port,
written to ``PORT_FILE``) and answers, as Stripe does:

* ``POST /v1/charges`` (JSON ``{"amount", "invoice"}``, header ``Idempotency-Key``): a
  new charge - or, for a key it has seen, the charge it made for that key (same id,
  header ``Idempotent-Replayed: true``), without charging again. A request without a key
  always charges;
* ``GET /v1/charges``: every charge it made, and every request it got (the test's
  witness: how many times the vendor was asked, with which keys).

It outlives the crashed worker (a separate process), as a real vendor does.

The client, :class:`Vendor`, is Stripe-shaped: ``Vendor(url).charges.create(amount=...,
invoice=..., idempotency_key=...)`` returns the charge as a dict.
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any


class Charges:
    """``vendor.charges``: ``create`` and ``list``, as a Stripe-like SDK names them."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/") + "/v1/charges"

    def create(self, *, amount: int, invoice: str, idempotency_key: str | None = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        body = json.dumps({"amount": amount, "invoice": invoice}).encode()
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            charge: dict[str, Any] = json.loads(response.read())
            charge["replayed"] = response.headers.get("Idempotent-Replayed") == "true"
            return charge

    def list(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url, timeout=30) as response:
            found: dict[str, Any] = json.loads(response.read())
            return found


class Vendor:
    def __init__(self, url: str) -> None:
        self.charges = Charges(url)


# --- the server --------------------------------------------------------------------------


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.charges: list[dict[str, Any]] = []
        self.by_key: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []


STATE = State()


class Handler(BaseHTTPRequestHandler):
    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        with STATE.lock:
            self._send(200, {"charges": STATE.charges, "requests": STATE.requests})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        params = json.loads(self.rfile.read(length) or b"{}")
        key = self.headers.get("Idempotency-Key")
        with STATE.lock:
            STATE.requests.append({"key": key, "invoice": params.get("invoice")})
            seen = STATE.by_key.get(key) if key is not None else None
            if seen is not None:
                self._send(200, seen, {"Idempotent-Replayed": "true"})
                return
            charge = {
                "id": f"ch_{len(STATE.charges) + 1}",
                "amount": params.get("amount"),
                "invoice": params.get("invoice"),
                "idempotency_key": key,
            }
            STATE.charges.append(charge)
            if key is not None:
                STATE.by_key[key] = charge
            self._send(200, charge)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


def serve(port_file: Path) -> None:
    server = HTTPServer(("127.0.0.1", 0), Handler)
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.rename(port_file)  # the test reads a whole port number or nothing
    server.serve_forever()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    serve(Path(sys.argv[1]))
