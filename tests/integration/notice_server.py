#!/usr/bin/env python3
"""A stand-in for the clouds' instance metadata endpoints, for the preemption tests.

Serves, for every worker name W, the two shapes of a preemption notice:
  GET /W/computeMetadata/v1/instance/preempted   GCE: "FALSE", or "TRUE" once preempted
  GET /W/latest/meta-data/spot/instance-action   AWS: 404, or {"action": "terminate", "time": ...}
  PUT /W/latest/api/token                        AWS IMDSv2 session token
W is preempted once the file FLAG_DIR/W exists. Writes its port to PORT_FILE.
Usage: notice_server.py FLAG_DIR PORT_FILE
"""
import datetime
import http.server
import json
import os
import sys

FLAG_DIR, PORT_FILE = sys.argv[1], sys.argv[2]


class Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self, status, body, content_type="text/plain"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _worker_and_path(self):
        parts = self.path.split("/", 2)
        return (parts[1], "/" + parts[2]) if len(parts) == 3 else ("", self.path)

    def do_PUT(self):
        _, path = self._worker_and_path()
        if path == "/latest/api/token":
            self._answer(200, "test-token")
        else:
            self._answer(404, "not found")

    def do_GET(self):
        worker, path = self._worker_and_path()
        preempted = worker != "" and os.path.exists(os.path.join(FLAG_DIR, worker))
        if path == "/computeMetadata/v1/instance/preempted":
            if self.headers.get("Metadata-Flavor") != "Google":
                self._answer(403, "missing Metadata-Flavor: Google")
            else:
                self._answer(200, "TRUE" if preempted else "FALSE")
        elif path == "/latest/meta-data/spot/instance-action":
            if not preempted:
                self._answer(404, "not found")
            else:
                when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=20)
                body = {"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
                self._answer(200, json.dumps(body), "application/json")
        else:
            self._answer(404, "not found")

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(PORT_FILE + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(PORT_FILE + ".tmp", PORT_FILE)
server.serve_forever()
