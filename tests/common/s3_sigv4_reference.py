"""Signs S3 requests with botocore, the reference our SigV4 signer is checked against.

Reads a JSON list of requests on stdin: {"method", "scheme_host" ("http://host:port"), "bucket",
"key" (raw), "virtual" (bool), "params" ([[name, value], ...], raw), "headers" ({name: value}),
"body" (text), "access_key", "secret_key", "token" (may be empty), "region", "time"
("YYYYMMDDTHHMMSSZ")}. Writes a JSON list of {"authorization", "canonical_request"}.
"""
import datetime
import json
import sys
from unittest import mock

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.utils import percent_encode


def sign(case):
    scheme, host = case["scheme_host"].split("://", 1)
    key_path = percent_encode(case["key"], safe="/~") if case["key"] else ""
    if case["virtual"]:
        url = f"{scheme}://{case['bucket']}.{host}/{key_path}"
    else:
        url = f"{scheme}://{host}/{case['bucket']}" + (f"/{key_path}" if key_path else "")
    request = AWSRequest(method=case["method"], url=url,
                         params=[tuple(p) for p in case["params"]] or None,
                         headers=dict(case["headers"]), data=case["body"].encode("utf-8"))
    credentials = Credentials(case["access_key"], case["secret_key"], case["token"] or None)
    auth = S3SigV4Auth(credentials, "s3", case["region"])
    fixed = datetime.datetime.strptime(case["time"], "%Y%m%dT%H%M%SZ")

    class FixedDatetime(datetime.datetime):
        @classmethod
        def utcnow(cls):
            return fixed

    with mock.patch("botocore.auth.datetime.datetime", FixedDatetime):
        auth.add_auth(request)
    return {"authorization": request.headers["Authorization"],
            "canonical_request": auth.canonical_request(request)}


json.dump([sign(c) for c in json.load(sys.stdin)], sys.stdout)
