"""An HTTP proxy in front of s3rver that checks every request's SigV4 signature with botocore.

s3rver accepts any V4 signature for a known key id, so tests put this in between: it recomputes
each request's signature with botocore's S3SigV4Auth at the request's own x-amz-date, over the
headers the request says it signed, the path as received and the query decoded and encoded again
(as S3 does), and checks x-amz-content-sha256 against the body. A request that fails is answered
as S3 would (403 SignatureDoesNotMatch, 400 XAmzContentSHA256Mismatch) and not forwarded; the
others go to s3rver path-style (a virtual-hosted request, Host BUCKET.s3.localhost:PORT, becomes
/BUCKET/KEY) and the answer comes back unchanged. The proxy also enforces S3's 5 MiB minimum part
size at CompleteMultipartUpload (400 EntityTooSmall), which s3rver does not.

Prints "listening on 127.0.0.1:PORT" once it accepts connections, and appends one JSON line per
request to --log: {"method", "host", "path", "query", "verified", "reason", "status"}.
"""
import argparse
import datetime
import hashlib
import http.client
import json
import re
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock
from urllib.parse import unquote, urlsplit
from xml.sax.saxutils import escape

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

VIRTUAL_HOST_SUFFIX = ".s3.localhost"
MIN_PART_SIZE = 5 << 20
AUTHORIZATION = re.compile(r"AWS4-HMAC-SHA256 Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),"
                           r"\s*Signature=([0-9a-f]+)$")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "content-length", "host"}

# botocore signs at datetime.utcnow(); patching it is not thread-safe, so one signature at a time.
signing_lock = threading.Lock()


class Refused(Exception):
    def __init__(self, status, code, reason):
        super().__init__(reason)
        self.status, self.code, self.reason = status, code, reason


def split_query(raw):
    """The decoded (name, value) pairs of a raw query string, in order."""
    pairs = []
    for item in raw.split("&") if raw else []:
        name, _, value = item.partition("=")
        pairs.append((unquote(name), unquote(value)))
    return pairs


def botocore_authorization(method, host, path, query, headers, signed, body, amz_date, args):
    """The Authorization header botocore computes for this request at amz_date."""
    to_sign = {name: headers.get(name, "") for name in signed
               if name not in ("x-amz-date", "x-amz-content-sha256")}
    request = AWSRequest(method=method, url=f"http://{host}{path}", headers=to_sign, data=body,
                         params=split_query(query) or None)
    if headers.get("x-amz-content-sha256") == "UNSIGNED-PAYLOAD":
        request.context["client_config"] = types.SimpleNamespace(
            s3={"payload_signing_enabled": False})
    auth = S3SigV4Auth(Credentials(args.access_key, args.secret_key), "s3", args.region)
    fixed = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ")

    class FixedDatetime(datetime.datetime):
        @classmethod
        def utcnow(cls):
            return fixed

    with signing_lock, mock.patch("botocore.auth.datetime.datetime", FixedDatetime):
        auth.add_auth(request)
    return request.headers["Authorization"]


def verify(method, host, path, query, headers, body, args):
    """Raises Refused unless the request is signed as botocore would sign it."""
    match = AUTHORIZATION.match(headers.get("authorization", ""))
    if match is None:
        raise Refused(403, "AccessDenied", "no AWS4-HMAC-SHA256 Authorization header")
    credential, signed_headers, _ = match.groups()
    if credential.split("/")[0] != args.access_key:
        raise Refused(403, "InvalidAccessKeyId", f"unknown key id in {credential}")
    content_sha256 = headers.get("x-amz-content-sha256", "")
    if re.fullmatch(r"[0-9a-f]{64}", content_sha256) and \
            content_sha256 != hashlib.sha256(body).hexdigest():
        raise Refused(400, "XAmzContentSHA256Mismatch",
                      f"x-amz-content-sha256 {content_sha256} is not the body's SHA-256")
    expected = botocore_authorization(method, host, path, query, headers,
                                      signed_headers.split(";"), body,
                                      headers.get("x-amz-date", ""), args)
    if AUTHORIZATION.match(expected).groups() != match.groups():
        raise Refused(403, "SignatureDoesNotMatch",
                      f"sent {headers['authorization']!r}, botocore computes {expected!r}")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and 100-continue is answered for us

    def do_request(self):
        args = self.server.args
        path, _, query = self.path.partition("?")
        host = self.headers.get("Host", "")
        headers = {name.lower(): value for name, value in self.headers.items()}
        entry = {"method": self.command, "host": host, "path": path, "query": query, "reason": ""}
        verified = False
        try:
            if "chunked" in headers.get("transfer-encoding", ""):
                # The client always sends Content-Length; say so loudly if that changes.
                self.close_connection = True
                raise Refused(501, "NotImplemented", "chunked request bodies are not supported")
            body = self.rfile.read(int(headers.get("content-length", "0")))
            verify(self.command, host, path, query, headers, body, args)
            verified = True
            self.check_part_sizes(query, body)
            status, response_headers, response_body = self.forward(host, path, query, body)
        except Refused as refused:
            status, response_headers, response_body = self.s3_error(refused, path)
            entry["reason"] = refused.reason
        except OSError as error:
            status, response_headers, response_body = self.s3_error(
                Refused(502, "BadGateway", f"s3rver: {error}"), path)
            entry["reason"] = str(error)
        entry.update(verified=verified, status=status)
        self.server.log(entry)
        self.answer(status, response_headers, response_body)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_request

    @staticmethod
    def s3_error(refused, path):
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{refused.code}</Code>'
                f"<Message>{escape(refused.reason)}</Message><Resource>{escape(path)}</Resource>"
                "</Error>")
        return refused.status, [("Content-Type", "application/xml")], body.encode()

    def check_part_sizes(self, query, body):
        """Records UploadPart sizes; refuses a completion with a small part other than the last."""
        params = dict(split_query(query))
        upload_id = params.get("uploadId")
        if upload_id is None:
            return
        with self.server.lock:
            parts = self.server.part_sizes.setdefault(upload_id, {})
            if self.command == "PUT" and "partNumber" in params:
                parts[int(params["partNumber"])] = len(body)
            elif self.command == "POST" and parts:
                last = max(parts)
                small = [n for n, size in parts.items() if n != last and size < MIN_PART_SIZE]
                if small:
                    raise Refused(400, "EntityTooSmall",
                                  f"parts {small} are smaller than {MIN_PART_SIZE} bytes")

    def forward(self, host, path, query, body):
        """Sends the request to s3rver path-style; returns its status, headers and body."""
        hostname = host.rsplit(":", 1)[0]
        if hostname.endswith(VIRTUAL_HOST_SUFFIX):
            bucket = hostname[:-len(VIRTUAL_HOST_SUFFIX)]
            path = f"/{bucket}" + ("" if path == "/" else path)
        params = dict(split_query(query))
        if self.server.args.list_page_size and params.get("list-type") == "2" and \
                "max-keys" not in params:
            # Short pages, so that a few keys exercise the continuation tokens.
            query += f"&max-keys={self.server.args.list_page_size}"
        upstream = urlsplit(self.server.args.upstream)
        headers = {name: value for name, value in self.headers.items()
                   if name.lower() not in HOP_BY_HOP}
        headers["Host"] = upstream.netloc
        headers["Content-Length"] = str(len(body))
        connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
        try:
            connection.request(self.command, path + (f"?{query}" if query else ""), body, headers)
            response = connection.getresponse()
            data = response.read()
            relayed = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
            if self.command == "HEAD":
                length = response.getheader("Content-Length")
                if length is not None:
                    relayed.append(("Content-Length", length))
            return response.status, relayed, data
        finally:
            connection.close()

    def answer(self, status, headers, body):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if self.command != "HEAD" and status not in (204, 304):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, *_):
        pass  # the JSON log says what matters


class Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, args):
        super().__init__(("127.0.0.1", 0), Handler)
        self.args = args
        self.lock = threading.Lock()
        self.part_sizes = {}  # uploadId -> {part number: size}; guarded by lock
        self.log_file = open(args.log, "a", encoding="utf-8")

    def log(self, entry):
        with self.lock:
            self.log_file.write(json.dumps(entry) + "\n")
            self.log_file.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="s3rver's endpoint, http://HOST:PORT")
    parser.add_argument("--access-key", required=True)
    parser.add_argument("--secret-key", required=True)
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--log", required=True, help="file to append one JSON line per request to")
    parser.add_argument("--list-page-size", type=int, default=0,
                        help="max-keys added to ListObjectsV2 requests that set none")
    args = parser.parse_args()
    proxy = Proxy(args)
    print(f"listening on 127.0.0.1:{proxy.server_address[1]}", flush=True)
    proxy.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
