"""Every feature that only some configs use, from dist/busbar as from the package: the SDK suites
run against the executable (gateway and mock both), and one call per optional dependency goes
through it to a loopback stand-in: the AWS credential chain (instance metadata, a profile's role
assumed through STS, web identity), a Vertex AI service account (RS256 through the bundled
libcrypto, cbusbar/rs256.pyx: the executable carries no cryptography), OTLP traces and a
request-log webhook (aiohttp). The Valkey and SQLite
stores are test_executable.py's. `busbar --validate` on a config that needs every optional module
finds each of them in the executable."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import openai

from tests import sdk_suites
from tests.conftest import free_port, start_gateway, stop
from tests.integration.fakes import Fake, service_account
from tests.integration.test_credentials import check_sigv4
from tests.packaging.conftest import ROOT

def test_sdk_suites_through_the_executable(exe):
    sdk_suites.run({"BUSBAR_TEST_EXECUTABLE": exe})


def aws_env(tmp_path, **extra):
    """An environment with no AWS credentials of the test machine's: no variables, no files."""
    env = {"HOME": str(tmp_path), "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
           "BUSBAR_ADMIN_LISTEN": "127.0.0.1:0"}
    env.update(extra)
    return env


def chat(port, model):
    c = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="x", max_retries=0, timeout=20)
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "hello from upstream"


def bedrock_config(fake, providers: dict) -> str:
    lines = ['listen: "127.0.0.1:{port}"', "providers:"]
    for name, extra in providers.items():
        lines.append('  %s: {protocol: bedrock, base_url: "%s", region: us-east-1%s}' % (name, fake.url, extra))
    lines.append("models:")
    for name in providers:
        lines.append('  %s: {provider: %s, upstream_model: "amazon.nova-lite-v1:0"}' % (name, name))
    return "\n".join(lines) + "\n"


def test_aws_chain_instance_metadata(exe, tmp_path):
    """No keys anywhere: the chain ends at the instance metadata service (IMDSv2, its session token
    first), as on EC2 or an EKS node."""
    fake = Fake()
    try:
        gw = start_gateway(tmp_path, bedrock_config(fake, {"bed": ", auth: sigv4"}), executable=exe,
                           base_env=aws_env(tmp_path, AWS_EC2_METADATA_SERVICE_ENDPOINT=fake.url + "/"))
        try:
            chat(gw.port, "bed")
        finally:
            stop(gw.proc)
        assert fake.find("/latest/api/token", "PUT")
        assert fake.find("/latest/meta-data/iam/security-credentials/" + Fake.IMDS_ROLE, "GET")
        check_sigv4(fake.find("/model/")[-1], "ASIAIMDS", "imds-secret", "imds-token",
                    "127.0.0.1:%d" % fake.port)
    finally:
        fake.close()


def test_aws_chain_profiles_through_sts(exe, tmp_path):
    """A profile's keys assume a role through STS (botocore's STS client: its API model, the query
    protocol, the XML answer), and a web identity profile is exchanged there too."""
    fake = Fake()
    try:
        (tmp_path / "webid").write_text("projected-jwt")
        (tmp_path / "aws-config").write_text(
            "[profile base]\naws_access_key_id = AKIDBASE\naws_secret_access_key = base-secret\n\n"
            "[profile wi]\nrole_arn = arn:aws:iam::123456789012:role/web\n"
            "web_identity_token_file = %s\n" % (tmp_path / "webid"))
        config = bedrock_config(fake, {
            "role": ', profile: base, role_arn: "arn:aws:iam::123456789012:role/assumed"',
            "webid": ", profile: wi"})
        gw = start_gateway(tmp_path, config, executable=exe, base_env=aws_env(
            tmp_path, AWS_CONFIG_FILE=str(tmp_path / "aws-config"), AWS_ENDPOINT_URL_STS=fake.url + "/sts",
            AWS_EC2_METADATA_DISABLED="true"))
        try:
            chat(gw.port, "role")
            chat(gw.port, "webid")
        finally:
            stop(gw.proc)
        role = [r for r in fake.find("/sts") if b"Action=AssumeRole&" in r["body"]]
        assert role and b"RoleSessionName=busbar" in role[0]["body"]
        assert "Credential=AKIDBASE/" in role[0]["headers"]["authorization"]
        webid = [r for r in fake.find("/sts") if b"AssumeRoleWithWebIdentity" in r["body"]]
        assert webid and b"WebIdentityToken=projected-jwt" in webid[0]["body"]
        signed = {r["headers"]["authorization"].split("Credential=")[1].split("/")[0]: r
                  for r in fake.find("/model/")}
        check_sigv4(signed["ASIAROLE"], "ASIAROLE", "ASIAROLE-secret", "ASIAROLE-token", "127.0.0.1:%d" % fake.port)
        check_sigv4(signed["ASIAWEBID"], "ASIAWEBID", "ASIAWEBID-secret", "ASIAWEBID-token",
                    "127.0.0.1:%d" % fake.port)
    finally:
        fake.close()


def test_vertex_service_account(exe, tmp_path):
    """RS256 over the service account's key (OpenSSL's, through cbusbar/rs256.pyx), exchanged at
    the token endpoint, which verifies it; the lane carries the token."""
    key = service_account(tmp_path / "sa.json")
    fake = Fake(public_key=key.public_key())
    try:
        config = (
            'listen: "127.0.0.1:{port}"\n'
            "providers:\n"
            '  vtx: {protocol: gemini, base_url: "%s", vertex: {project: proj-test, location: us-central1},\n'
            '        credentials: {file: sa.json}, token_url: "%s/token"}\n'
            "models:\n"
            "  gem: {provider: vtx, upstream_model: gemini-2.5-flash}\n" % (fake.url, fake.url))
        (tmp_path / "config").mkdir()
        (tmp_path / "config" / "sa.json").write_text((tmp_path / "sa.json").read_text())
        gw = start_gateway(tmp_path / "config", config, executable=exe,
                           base_env={"BUSBAR_ADMIN_LISTEN": "127.0.0.1:0"})
        try:
            chat(gw.port, "gem")
        finally:
            stop(gw.proc)
        assert fake.tokens_issued >= 1
        req = fake.find("/v1/projects/")[-1]
        assert req["headers"]["authorization"].startswith("Bearer ya29.fake-")
    finally:
        fake.close()


def test_otlp_and_webhook_export(exe, tmp_path):
    """An OTLP/HTTP collector and a request-log webhook on loopback (aiohttp's client, pure
    Python in the executable) each receive the request."""
    fake = Fake()
    fake.routes.append((lambda method, path: path in ("/v1/traces", "/hook"),
                        lambda req: (200, "application/json", b"{}")))
    try:
        config = (
            'listen: "127.0.0.1:{port}"\n'
            "providers:\n"
            '  up: {protocol: openai, base_url: "%s/openai", api_key: {env: UP_KEY}}\n'
            "models:\n"
            "  m: {provider: up, upstream_model: gpt-x}\n"
            "export:\n"
            '  traces: {module: otlp, settings: {url: "%s/v1/traces"}}\n'
            "  hook:\n"
            "    module: request-log-webhook\n"
            '    settings: {url: "%s/hook", auth_header: {name: authorization, value: "Bearer hook-secret"}}\n'
            % (fake.url, fake.url, fake.url))
        gw = start_gateway(tmp_path, config, executable=exe,
                           base_env={"UP_KEY": "sk-up", "BUSBAR_ADMIN_LISTEN": "127.0.0.1:0"})
        try:
            chat(gw.port, "m")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not (fake.find("/v1/traces") and fake.find("/hook")):
                time.sleep(0.05)
        finally:
            stop(gw.proc)
        spans = [s for r in fake.find("/v1/traces")
                 for rs in json.loads(r["body"])["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
        assert spans and all(len(s["traceId"]) == 32 for s in spans)
        hook = fake.find("/hook")
        assert hook and hook[0]["headers"]["authorization"] == "Bearer hook-secret"
        record = json.loads(hook[0]["body"])
        assert record["pool"] == "m" and record["outcome"] == "ok"
    finally:
        fake.close()


def test_validate_finds_every_optional_module(exe, tmp_path):
    """A config that needs each module busbar imports only on demand (busbar/config/modules.py:
    the Valkey store, aiohttp's sinks, botocore's chain, cryptography's RS256) validates in the
    executable, and nothing says the executable lacks one."""
    sys.path.insert(0, ROOT)
    from busbar.config.modules import OPTIONAL
    assert set(OPTIONAL) == {"redis", "asyncpg", "aiohttp", "botocore", "cryptography"}, \
        "a new optional module: give it a line in the configs below"
    service_account(tmp_path / "sa.json")
    (tmp_path / "config.yaml").write_text(
        'listen: "127.0.0.1:%d"\n'
        "providers:\n"
        "  bedrock: {auth: sigv4, region: us-east-1}\n"
        "  vertex: {protocol: gemini, base_url: \"https://us-central1-aiplatform.googleapis.com\",\n"
        "           vertex: {project: p, location: us-central1}, credentials: {file: sa.json}}\n"
        "models:\n"
        "  b: {provider: bedrock, upstream_model: \"amazon.nova-lite-v1:0\"}\n"
        "  g: {provider: vertex, upstream_model: gemini-2.5-flash}\n"
        "store: {module: valkey, settings: {url: \"redis://127.0.0.1:%d\"}}\n"
        "export:\n"
        '  traces: {module: otlp, settings: {url: "http://127.0.0.1:4318/v1/traces"}}\n'
        '  hook: {module: request-log-webhook, settings: {url: "https://logs.example.org/in"}}\n'
        % (free_port(), free_port()))
    r = subprocess.run([exe, "--validate", "--config", str(tmp_path / "config.yaml")], env={},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not re.search(r"lacks|does not include|needs the Python package", r.stdout + r.stderr), r.stderr
    # one store a config: the Postgres one (asyncpg) in a second
    text = (tmp_path / "config.yaml").read_text().replace(
        'store: {module: valkey, settings: {url: "redis://127.0.0.1:',
        'store: {module: postgres, settings: {url: "postgres://busbar@127.0.0.1:')
    (tmp_path / "config.yaml").write_text(text)
    r = subprocess.run([exe, "--validate", "--config", str(tmp_path / "config.yaml")], env={},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "module: postgres" in text, r.stdout + r.stderr
    assert not re.search(r"lacks|does not include|needs the Python package", r.stdout + r.stderr), r.stderr
