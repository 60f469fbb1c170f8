"""busbar.upstream.sigv4 against botocore's SigV4Auth (what boto3 itself signs with) and AWS's
published Signature Version 4 test suite."""
import datetime
import time
from unittest import mock

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from busbar.upstream.sigv4 import SigV4Signer, parse_credential, region_from_host

AMZ_DATE = "20240501T120000Z"
WHEN = datetime.datetime(2024, 5, 1, 12, 0, 0)


def botocore_headers(method, url, body, region, service="bedrock", token=None, headers=None,
                     when=WHEN):
    req = AWSRequest(method, url, data=body, headers=dict(headers or {}))
    with mock.patch("botocore.auth.get_current_datetime", return_value=when):
        SigV4Auth(Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token),
                  service, region).add_auth(req)
    return req.headers


CASES = [
    # (model path as sent on the wire, query, body)
    ("/model/anthropic.claude-3-5-sonnet-20241022-v2%3A0/converse", "", b'{"messages":[]}'),
    ("/model/us.anthropic.claude-3-7-sonnet-20250219-v1%3A0/converse-stream", "", b"{}"),
    ("/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.meta.llama3"
     "/converse", "", b'{"x":1}'),
    ("/model/amazon.nova-pro-v1%3A0/converse", "", b""),
    ("/model/meta.llama3-70b-instruct-v1%3A0/converse", "", b"x" * (3 * 1024 * 1024)),
    ("/model/cohere.command-r-v1%3A0/converse", "b=2&a=1&a=0", "ünïcode ✓".encode()),
    ("/model/mistral.mistral-large-2402-v1%3A0/./x/../converse", "", b"{}"),
]


@pytest.mark.parametrize("path,query,body", CASES)
@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEJr//////////wEaDPzIuRLYH8zPAw=="])
@pytest.mark.parametrize("content_type", [None, "application/json"])
def test_authorization_is_byte_identical_to_botocore(path, query, body, token, content_type):
    host = "bedrock-runtime.us-west-2.amazonaws.com"
    url = "https://" + host + path + ("?" + query if query else "")
    extra = {"Content-Type": content_type} if content_type else {}
    want = botocore_headers("POST", url, body, "us-west-2", token=token, headers=extra)
    signer = SigV4Signer("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token,
                         "us-west-2")
    got = dict(signer.sign("POST", host, path, query, body, AMZ_DATE, content_type=content_type))
    assert got["Authorization"] == want["Authorization"]
    assert got["X-Amz-Date"] == want["X-Amz-Date"] == AMZ_DATE
    if token:
        assert got["X-Amz-Security-Token"] == want["X-Amz-Security-Token"] == token
    else:
        assert "X-Amz-Security-Token" not in got
    # botocore sends no body hash header for bedrock (only S3 does), and neither does busbar.
    assert "X-Amz-Content-SHA256" not in want and "X-Amz-Content-SHA256" not in got


def test_colon_is_double_encoded_in_the_canonical_request():
    host = "bedrock-runtime.us-east-1.amazonaws.com"
    path = "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"
    auth = SigV4Auth(Credentials("AKIDEXAMPLE", "secret"), "bedrock", "us-east-1")
    req = AWSRequest("POST", "https://" + host + path, data=b"{}")
    req.context["timestamp"] = AMZ_DATE
    assert "\n/model/anthropic.claude-3-haiku-20240307-v1%253A0/converse\n" in auth.canonical_request(req)
    signer = SigV4Signer("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", region="us-east-1")
    got = dict(signer.sign("POST", host, path, "", b"{}", AMZ_DATE))
    assert got["Authorization"] == botocore_headers("POST", "https://" + host + path, b"{}",
                                                    "us-east-1")["Authorization"]
    # Signing the decoded path (`:` encoded only once) gives a different signature.
    once = dict(signer.sign("POST", host, path.replace("%3A", ":"), "", b"{}", AMZ_DATE))
    assert once["Authorization"] != got["Authorization"]


def test_aws_get_vanilla():
    # aws-sig-v4-test-suite/get-vanilla: GET / on example.amazonaws.com, no body.
    signer = SigV4Signer("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                         region="us-east-1", service="service")
    got = dict(signer.sign("GET", "example.amazonaws.com", "/", "", b"", "20150830T123600Z"))
    assert got["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;x-amz-date, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")


def test_signing_key_is_cached_per_day():
    signer = SigV4Signer("AKID", "SECRET", region="eu-central-1")
    with mock.patch("busbar.upstream.sigv4.hmac.digest", wraps=__import__("hmac").digest) as d:
        def derivations():
            # A derivation starts with an HMAC keyed by "AWS4" + the secret key.
            return sum(1 for c in d.call_args_list if c.args[0] == b"AWS4SECRET")
        signer.sign("POST", "h", "/", "", b"", "20240501T000000Z")
        signer.sign("POST", "h", "/", "", b"", "20240501T235959Z")
        assert derivations() == 1
        signer.sign("POST", "h", "/", "", b"", "20240502T000001Z")
        assert derivations() == 2
    # Across midnight the signature must use the new day's key: compare with botocore.
    want = botocore_headers("POST", "https://h/", b"", "eu-central-1",
                            when=datetime.datetime(2024, 5, 2, 0, 0, 1))
    s2 = SigV4Signer("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", region="eu-central-1")
    s2.sign("POST", "h", "/", "", b"", "20240501T235959Z")
    assert dict(s2.sign("POST", "h", "/", "", b"", "20240502T000001Z"))["Authorization"] == \
        want["Authorization"]


def test_default_date_is_now_in_utc():
    signer = SigV4Signer("AKID", "SECRET", region="us-east-1")
    fixed = datetime.datetime(2031, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc).timetuple()
    with mock.patch("busbar.upstream.sigv4.time.gmtime", return_value=fixed):
        got = dict(signer.sign("POST", "h", "/", "", b""))
    assert got["X-Amz-Date"] == "20310102T030405Z"
    assert "/20310102/us-east-1/bedrock/aws4_request" in got["Authorization"]


def test_repr_hides_the_secret():
    signer = SigV4Signer("AKID", "TOPSECRET", "SESSIONTOKEN", "us-east-1")
    assert "TOPSECRET" not in repr(signer) and "SESSIONTOKEN" not in repr(signer)


@pytest.mark.parametrize("args", [("", "s"), ("a", ""), ("a", "s", None, None)])
def test_signer_needs_keys_and_region(args):
    with pytest.raises(ValueError):
        SigV4Signer(*args) if len(args) == 4 else SigV4Signer(*args, region="us-east-1")


def test_parse_credential():
    assert parse_credential("AKID:SECRET") == ("AKID", "SECRET", None)
    assert parse_credential("AKID:SE/CR+ET:TOKEN") == ("AKID", "SE/CR+ET", "TOKEN")
    assert parse_credential("AKID:SECRET:") == ("AKID", "SECRET", None)
    assert parse_credential(" AKID:SECRET:TOK:EN\n") == ("AKID", "SECRET", "TOK:EN")
    for bad in ("", "AKID", "AKID:", ":SECRET", None, 5):
        with pytest.raises(ValueError) as exc:
            parse_credential(bad)
        assert "SECRET" not in str(exc.value).replace("SECRET_ACCESS_KEY", "")


@pytest.mark.parametrize("host,region", [
    ("bedrock-runtime.us-east-1.amazonaws.com", "us-east-1"),
    ("bedrock-runtime.eu-west-3.amazonaws.com:443", "eu-west-3"),
    ("bedrock-runtime-fips.us-gov-west-1.amazonaws.com", "us-gov-west-1"),
    ("bedrock-runtime.cn-north-1.amazonaws.com.cn", "cn-north-1"),
    ("vpce-0a1b2c.bedrock-runtime.ap-southeast-2.vpce.amazonaws.com", "ap-southeast-2"),
    ("BEDROCK-RUNTIME.US-EAST-2.AMAZONAWS.COM", "us-east-2"),
    ("api.anthropic.com", None),
    ("localhost:8080", None),
    ("bedrock-runtime", None),
    ("", None),
    ("[::1]:443", None),
])
def test_region_from_host(host, region):
    assert region_from_host(host) == region


def test_default_date_is_formatted_once_a_second():
    signer = SigV4Signer("AKID", "SECRET", region="us-east-1")
    t = [1956361445.2, 1956361445.9, 1956361446.0]     # 2031-12-30 01:44:05 UTC, same, +1 s
    with mock.patch("busbar.upstream.sigv4.time.time", side_effect=t), \
            mock.patch("busbar.upstream.sigv4.time.strftime", wraps=time.strftime) as f:
        dates = [dict(signer.sign("POST", "h", "/", "", b""))["X-Amz-Date"] for _ in t]
    assert dates == ["20311230T014405Z", "20311230T014405Z", "20311230T014406Z"]
    assert f.call_count == 2
