"""The embedded default config: every protocol answered by the built-in mock, no API key needed.
`busbar serve --demo` starts the mock on a free loopback port in the same process and routes to it."""
import socket

DEMO_YAML = """\
# busbar demo: six lanes on the built-in mock provider, one per wire protocol.
listen: "{listen}"
providers:
  mock-openai:    {{protocol: openai,    base_url: "http://127.0.0.1:{port}"}}
  mock-responses: {{protocol: responses, base_url: "http://127.0.0.1:{port}"}}
  mock-anthropic: {{protocol: anthropic, base_url: "http://127.0.0.1:{port}"}}
  mock-gemini:    {{protocol: gemini,    base_url: "http://127.0.0.1:{port}"}}
  mock-cohere:    {{protocol: cohere,    base_url: "http://127.0.0.1:{port}"}}
  mock-bedrock:   {{protocol: bedrock,   base_url: "http://127.0.0.1:{port}"}}
models:
  gpt-4o-mini:       {{provider: mock-openai}}
  gpt-4.1-mini:      {{provider: mock-responses}}
  claude-haiku-4-5:  {{provider: mock-anthropic}}
  gemini-2.5-flash:  {{provider: mock-gemini}}
  command-r:         {{provider: mock-cohere}}
  "amazon.nova-lite-v1:0": {{provider: mock-bedrock}}
pools:
  default:
    members:
      - {{model: gpt-4o-mini, weight: 1}}
      - {{model: claude-haiku-4-5, weight: 1}}
advanced:
  response_headers:
    server_timing: true
# Metrics on: the status page (the admin listener's /) and /metrics have figures to show.
export:
  metrics: {{module: prometheus, settings: {{buffer_seconds: 60}}}}
# The admin API on 127.0.0.1:8081 (loopback) with no token: open, warned about at boot.
auth:
  admin_auth: []
"""

# The SDK lines are one shell line each (every line runs as printed), written here in parts.
BANNER = (
    """\
busbar is listening on http://{addr} (demo config: the built-in mock answers, no API key needed)
  models: {models}
  pools:  {pools} (members: {members})
  admin:  http://{admin}/api/v1/admin (open: demo only)
  status: http://{admin}/ (the live status page: req/s, busbar's latency, each lane's breaker)
  stats:  http://{addr}/stats (every lane's breaker and capacity, JSON)

  # OpenAI Chat Completions, routed to the pool 'default' (OpenAI + Anthropic lanes):
  curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model":"default","messages":[{{"role":"user","content":"Hello"}}]}}'

  # Anthropic Messages into an OpenAI lane (translated both ways), streamed:
  curl -sN http://{addr}/v1/messages -H 'content-type: application/json' -H 'anthropic-version: 2023-06-01' \\
    -d '{{"model":"gpt-4o-mini","max_tokens":64,"stream":true,"messages":[{{"role":"user","content":"Hi"}}]}}'

  # The official SDKs (keys are not checked while busbar has none configured; the SDKs insist on one):{sdk_note}
"""
    "  {py} -c \"import openai; c=openai.OpenAI(base_url='http://{addr}/v1', api_key='demo'); "
    "print(c.chat.completions.create(model='gemini-2.5-flash', "
    "messages=[{{'role':'user','content':'Hi'}}]).choices[0].message.content)\"\n"
    "  {py} -c \"import anthropic; c=anthropic.Anthropic(base_url='http://{addr}', api_key='demo'); "
    "print(c.messages.create(model='claude-haiku-4-5', max_tokens=64, "
    "messages=[{{'role':'user','content':'Hi'}}]).content[0].text)\"\n"
    "  {py} -c \"import boto3; c=boto3.client('bedrock-runtime', endpoint_url='http://{addr}', "
    "region_name='us-east-1', aws_access_key_id='demo', aws_secret_access_key='demo'); "
    "print(c.converse(modelId='amazon.nova-lite-v1:0', messages=[{{'role':'user','content':[{{'text':'Hi'}}]}}])"
    "['output']['message']['content'][0]['text'])\"\n"
    """
  # The admin API:
  curl -s http://{admin}/api/v1/admin/pools
""")


# The SDKs the banner's Python lines import, by module, and their pip names.
SDKS = {"openai": "openai", "anthropic": "anthropic", "boto3": "boto3"}


def sdk_python() -> tuple[str, str]:
    """(interpreter, note) for the banner's SDK lines. This interpreter when it has every SDK (the
    `make` venv); else `python3`, with a note to install them: the single-file executable is not
    a Python interpreter at all, and a pip install's venv has none of the SDKs."""
    import importlib.util
    import shlex
    import sys
    if not getattr(sys, "frozen", False) and sys.executable:
        try:
            has_all = all(importlib.util.find_spec(m) is not None for m in SDKS)
        except (ImportError, ValueError):
            has_all = False
        if has_all:
            return shlex.quote(sys.executable), ""
    return "python3", "\n  # (they are not installed with busbar; first: python3 -m pip install %s)" % (
        " ".join(SDKS.values()))


def banner(cfg) -> str:
    """What `busbar serve --demo` prints: every line runs as printed (the Python lines once the
    SDKs they import are installed, which the banner says when this interpreter lacks them)."""
    ctl = cfg.control
    py, note = sdk_python()
    return BANNER.format(
        addr="%s:%d" % (cfg.listen_host, cfg.listen_port),
        admin="%s:%d" % (ctl.admin_host, ctl.admin_port),
        models=", ".join(cfg.models), pools=", ".join(cfg.pools),
        members=", ".join(m.model.name for p in cfg.pools.values() for m in p.members),
        py=py, sdk_note=note)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_yaml(listen: str, mock_port: int) -> str:
    return DEMO_YAML.format(listen=listen, port=mock_port)
