"""Inbound TLS and mTLS with a real handshake (SPEC §8): `tls:` on the data listener, `admin_tls:`
with a client CA on the admin listener; the openai SDK against a CA this test makes, with and
without a client certificate; ALPN http/1.1; a bad PEM fails boot naming its key path."""
import datetime
import http.client
import ssl
import subprocess

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.conftest import PY, ROOT, env, free_port, stop, start_gateway


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject_cn, issuer_cert, issuer_key, key, ca=False, server=False):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(_name(subject_cn))
         .issuer_name(issuer_cert.subject if issuer_cert else _name(subject_cn))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _pem_key(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("busbar test CA", None, ca_key, ca_key, ca=True)
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv = _cert("localhost", ca, ca_key, srv_key, server=True)
    cli_key = ec.generate_private_key(ec.SECP256R1())
    cli = _cert("ops client", ca, ca_key, cli_key)
    files = {"ca.pem": ca.public_bytes(serialization.Encoding.PEM),
             "server.pem": srv.public_bytes(serialization.Encoding.PEM), "server.key": _pem_key(srv_key),
             "client.pem": cli.public_bytes(serialization.Encoding.PEM), "client.key": _pem_key(cli_key)}
    for n, data in files.items():
        (d / n).write_bytes(data)
    return d


CONFIG = """\
listen: "127.0.0.1:{port}"
admin_listen: "127.0.0.1:{admin}"
tls: {{cert: {{file: {d}/server.pem}}, key: {{env: TLS_KEY}}}}
admin_tls: {{cert: {{file: {d}/server.pem}}, key: {{file: {d}/server.key}}, client_ca: {{file: {d}/ca.pem}}}}
providers:
  m: {{protocol: openai, base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
models:
  a: {{provider: m, upstream_model: gpt-4o-mini}}
auth:
  admin_auth: []
"""


def _wait_tls(port, proc, ctx):
    import socket
    import time
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            with socket.create_connection(("127.0.0.1", port), 1) as s:
                with ctx.wrap_socket(s, server_hostname="localhost"):
                    return
        except (OSError, ssl.SSLError):
            time.sleep(0.1)
    raise RuntimeError("no TLS listener on %d" % port)


GW_PID = []     # the TLS gateway's parent process


@pytest.fixture(scope="module")
def tls_gw(pki, mock_port, tmp_path_factory):
    port, admin = free_port(), free_port()
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    gw = start_gateway(tmp_path_factory.mktemp("tlsgw"), CONFIG.format(
        port=port, admin=admin, d=pki, mock=mock_port), 2, port=port, stderr=subprocess.PIPE,
        # a PEM from an environment variable
        extra_env={"TLS_KEY": (pki / "server.key").read_text()},
        ready=lambda port, proc: _wait_tls(port, proc, ctx))
    GW_PID[:] = [gw.proc.pid]
    try:
        yield port, admin
    finally:
        stop(gw.proc)


def _ctx(pki, client_cert=False):
    # httpx 0.29 takes client certificates only through the SSLContext (`cert=` is ignored).
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if client_cert:
        ctx.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
    return ctx


def test_openai_sdk_over_tls_with_alpn(tls_gw, pki):
    port, _ = tls_gw
    c = openai.OpenAI(base_url="https://localhost:%d/v1" % port, api_key="x",
                      http_client=httpx.Client(verify=_ctx(pki)))
    r = c.chat.completions.create(model="a", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    assert conn.sock.selected_alpn_protocol() == "http/1.1"
    conn.close()
    # plain HTTP to the TLS port gets no answer
    plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    with pytest.raises((http.client.HTTPException, OSError)):
        plain.request("GET", "/healthz")
        plain.getresponse()


def test_admin_mtls_requires_a_client_certificate(tls_gw, pki):
    _, admin = tls_gw
    url = "https://localhost:%d/api/v1/admin/info" % admin
    with httpx.Client(verify=_ctx(pki, True)) as c:
        r = c.get(url)
        assert r.status_code == 200 and "config_version" in r.json()
    with httpx.Client(verify=_ctx(pki)) as c:
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            c.get(url)
    # and the openai SDK with and without a client certificate, against an mTLS listener
    ok = openai.OpenAI(base_url="https://localhost:%d/v1" % admin, api_key="x", max_retries=0,
                       http_client=httpx.Client(verify=_ctx(pki, True)))
    with pytest.raises(openai.NotFoundError):      # handshake passed: the admin site answers 404
        ok.models.list()
    no = openai.OpenAI(base_url="https://localhost:%d/v1" % admin, api_key="x", max_retries=0,
                       http_client=httpx.Client(verify=_ctx(pki)))
    with pytest.raises(openai.APIConnectionError):
        no.models.list()


def test_a_bad_pem_fails_boot_with_its_key_path(pki, tmp_path):
    bad = tmp_path / "bad.pem"
    bad.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    for text, where in (
        ("tls: {cert: {file: %s}, key: {file: %s/server.key}}" % (bad, pki), "tls.cert"),
        ("tls: {cert: {file: %s/server.pem}, key: {file: %s/nope.key}}" % (pki, pki), "tls.key"),
        ("tls: {cert: {file: %s/server.pem}, key: {file: %s/client.key}}" % (pki, pki), "tls.key"),
    ):
        cfg = tmp_path / "c.yaml"
        cfg.write_text("providers:\n  m: {protocol: openai, base_url: 'http://127.0.0.1:9'}\n"
                       "models:\n  a: {provider: m}\n" + text + "\n")
        r = subprocess.run([PY, "-m", "busbar.cli", "validate", "--config", str(cfg)], cwd=ROOT,
                           env=env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and r.stderr.startswith("error: " + where + ":"), (text, r.stderr)


def _minflt(pid):
    """Minor page faults of `pid` and its child processes (the other workers)."""
    total = 0
    kids = open("/proc/%d/task/%d/children" % (pid, pid)).read().split()
    for p in [pid] + [int(k) for k in kids]:
        total += int(open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()[7])
    return total


def test_requests_over_tls_take_no_page_fault(tls_gw, pki):
    """uvloop's TLS transport would allocate a 256 KiB read buffer per read, an mmap + page fault
    + munmap each under busbar's fixed mmap threshold (2 faults a request, ~40 µs of CPU); the
    listener's TlsReader decrypts into one shared buffer instead."""
    import json
    port, _ = tls_gw
    conn = http.client.HTTPSConnection("localhost", port, context=_ctx(pki), timeout=10)
    body = json.dumps({"model": "a", "messages": [{"role": "user", "content": "hi"}]})

    def send(n):
        for _ in range(n):
            conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            r = conn.getresponse()
            assert r.status == 200
            r.read()
    send(50)                                     # warm: first allocations of this connection
    before = _minflt(GW_PID[0])
    send(300)
    after = _minflt(GW_PID[0])
    conn.close()
    assert after - before < 100, after - before
