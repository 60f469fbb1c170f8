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
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_yaml(listen: str, mock_port: int) -> str:
    return DEMO_YAML.format(listen=listen, port=mock_port)
