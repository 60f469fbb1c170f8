"""The validated configuration: frozen dataclasses the rest of busbar reads.

Everything here is already checked and resolved (secrets read, URLs parsed, catalog merged), so the
server and engine never re-validate. Objects are frozen: a reload builds a new Config and swaps it
whole. Secret values live only in `Provider.api_key` and `Provider.headers`, and no repr prints them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# reliability: pool/provider settings of SPEC §4 (busbar/reliability/policy.py)
from busbar.reliability.policy import (DEFAULT_BREAKER, DEFAULT_FAILOVER, DEFAULT_HEALTH,
                                       DEFAULT_ON_EXHAUSTED, BreakerPolicy, FailoverPolicy,
                                       HealthPolicy, OnExhausted)

# The wire protocols a lane can speak: the six of SPEC §1.2, and `bedrock-invoke` (Anthropic
# Messages bodies through Bedrock InvokeModel, what anthropic.AnthropicBedrock speaks).
PROTOCOLS: tuple[str, ...] = ("openai", "responses", "anthropic", "gemini", "cohere", "bedrock",
                              "bedrock-invoke")
# Protocols whose requests are SigV4-signed for Bedrock (region, profile, role_arn apply).
AWS_PROTOCOLS: tuple[str, ...] = ("bedrock", "bedrock-invoke")

# How the egress request carries the provider key. `api-key` is Azure OpenAI's `api-key:` header;
# `none` is a keyless local server (Ollama, vLLM, the built-in mock). `oauth2` is a bearer token
# busbar obtains itself from `credentials:` (a GCP service account, for Vertex AI).
AUTH_MODES: tuple[str, ...] = ("bearer", "x-api-key", "x-goog-api-key", "sigv4", "api-key", "oauth2",
                               "none")

# Each protocol's native key carrier, as its official SDK sends it (SPEC §1.2 "Auth out").
DEFAULT_AUTH: dict[str, str] = {
    "openai": "bearer",
    "responses": "bearer",
    "cohere": "bearer",
    "anthropic": "x-api-key",
    "gemini": "x-goog-api-key",
    "bedrock": "sigv4",
    "bedrock-invoke": "sigv4",
}

REDACTED = "<redacted>"

_MiB = 1024 * 1024
_KiB = 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """Every bound busbar enforces, each with a `limits:` key of the same name."""

    # Same as the reference gateway (SPEC §8); OpenAI's own request cap for chat bodies with
    # base64 images is 20-50 MiB, so 32 MiB admits real multimodal requests and bounds memory.
    request_body_max_bytes: int = 32 * _MiB
    # Total request-line + header bytes. nginx's large_client_header_buffers is 4x8 KiB, Apache's
    # LimitRequestFieldSize 8 KiB per field, h11 16 KiB; SDKs send < 2 KiB, but proxies in front may
    # add long forwarding and tracing headers, so 64 KiB is generous and still bounded.
    header_max_bytes: int = 64 * _KiB
    # Apache's LimitRequestFields and Go's net/http both default to 100 header fields.
    header_count_max: int = 100
    # Time to receive a complete request head (slowloris guard). The reference applies 30 s on its
    # TLS listener (SPEC §8); nginx's client_header_timeout is 60 s, Apache's RequestReadTimeout 20 s.
    header_read_timeout_secs: float = 30.0
    # Keep-alive idle before busbar closes a client connection. Longer than the 60 s idle timeout
    # of AWS ALB and GCP load balancers, so the balancer, not busbar, closes first (no reset races).
    idle_timeout_secs: float = 75.0
    # Fixed at 10 s in the reference (SPEC §4.3); a TCP+TLS handshake to a healthy API takes < 1 s.
    upstream_connect_timeout_secs: float = 10.0
    # The client-level bound on a streaming upstream request (SPEC §4.3: 300 s); long reasoning
    # generations run for minutes.
    upstream_request_timeout_secs: float = 300.0
    # Idle keep-alive connections kept per upstream host; aiohttp's connector default limit_per_host
    # is unbounded, hyper's pool_max_idle_per_host is unbounded; 64 covers bursts without hoarding.
    pool_max_idle_per_host: int = 64
    # hyper's default pool_idle_timeout is 90 s; provider edges (Cloudflare, Google) keep idle
    # connections about that long, so a longer wait mostly yields connections they already closed.
    pool_idle_timeout_secs: float = 90.0
    # Global inbound cap outside everything else (SPEC §4.3: default 8192; 0 turns it off).
    max_inbound_concurrent: int = 8192
    # max_tokens injected on a cross-protocol hop to Anthropic when the caller gave none (SPEC §1.6).
    default_max_tokens: int = 4096
    # `reasoning_effort_budgets`: the thinking tokens of each effort word (minimal, low, medium,
    # high) where a request crosses between words (OpenAI reasoning_effort) and budgets (Anthropic
    # thinking, Gemini thinkingBudget): the Rust gateway's defaults, which are Anthropic's
    # minimum budget (1024) and doublings up to a 16 Ki budget that fits its models' output caps.
    reasoning_effort_budgets: tuple = (1024, 4096, 8192, 16384)
    # Upstream error bodies are buffered to be classified and re-enveloped (SPEC §8: 256 KiB).
    upstream_error_body_max_bytes: int = 256 * _KiB
    # Reading an upstream error body once its status arrived, within what is left of the
    # attempt's own bound: the status already says what happened (mostly "fail over"), so a body
    # that stalls must not hold the next lane back. Error bodies are small (< 1 KiB) and written
    # with their head, so they come within a round trip of it; 250 ms is several long-haul round
    # trips. 5 s (the old value) was a whole interactive client's timeout: callers failed while a
    # healthy lane was there (issue 34). When it passes, the status alone classifies, and a
    # caller with no lane left gets busbar's own error for that status.
    upstream_error_body_timeout_secs: float = 0.25
    # A TLS client must finish its handshake within this (SPEC §8: 10 s); a client that opens a
    # connection and stalls mid-handshake holds a socket and memory, like a slow header read.
    tls_handshake_timeout_secs: float = 10.0
    # SIGTERM waits this long for in-flight requests; Kubernetes' default
    # terminationGracePeriodSeconds is 30 s, after which the pod is killed anyway.
    drain_timeout_secs: float = 30.0
    # reliability: how long a lane whose configured key was refused (401/403, billing) stays
    # benched (SPEC §4.1: 1800 s): a wrong key is fixed by a person, not by retrying sooner.
    hard_down_cooldown_secs: float = 1800.0
    # reliability: an upstream Retry-After is a cooldown floor up to this cap (SPEC §4.2: a day),
    # so a provider sending an absurd value cannot bench a lane for weeks.
    max_honored_retry_after_secs: float = 86400.0
    # reliability: with several workers, a worker with requests queued for a permit (on_exhausted:
    # queue) polls the shared permit count from 1 ms, backing off to this: a permit released in
    # another worker idles at most this long; 16 ms keeps a waiting worker at ~60 wake-ups a
    # second (busbar/reliability/queue.py). Nothing polls while nobody waits.
    queue_poll_max_ms: int = 16
    # Request-body bytes one worker holds at once (received and not yet answered, plus bodies being
    # received); over it the worker stops reading from its clients until half of it is free, so
    # the excess waits in the kernel's socket buffers instead of the heap (back-pressure, no
    # errors; busbar/server/http.py BodyBudget). Envoy's per_connection_buffer_limit_bytes (1 MiB)
    # bounds each connection, not their sum; nginx spills bodies over client_body_buffer_size to
    # disk. 32 MiB is one largest body (request_body_max_bytes) or ~220 bodies of 150 KB, which
    # still fill two cores; a body larger than the budget is served alone. Measured under
    # bench/soak_memory.py: see the commit that set it. 0 turns it off.
    inflight_body_bytes: int = 32 * _MiB
    # Sessions whose lane a pool with `affinity: {mode: session}` remembers, for every worker
    # together (busbar/routing/signals.py, 16 bytes each in shared memory: 1 MiB). A pin keeps a
    # conversation on the lane whose provider-side prompt cache is warm, and those caches live
    # minutes (Anthropic's 5 min by default, OpenAI's 5-60); 65,536 conversations active within
    # that is a large agent fleet. Past it the least recently used pin of the same table set is
    # forgotten and that session is routed afresh (then pinned again), so the bound costs a cache
    # miss, never an error. Sized at start (a reload keeps the boot size).
    affinity_max_sessions: int = 65536


# limits keys whose value must be an integer >= their floor (0 allowed only where it means "off").
LIMIT_INT_FLOORS: dict[str, int] = {
    "request_body_max_bytes": 1,
    "header_max_bytes": 1,
    "header_count_max": 1,
    "pool_max_idle_per_host": 0,
    "max_inbound_concurrent": 0,
    "default_max_tokens": 1,
    "upstream_error_body_max_bytes": 1,
    "queue_poll_max_ms": 1,
    "inflight_body_bytes": 0,
    "affinity_max_sessions": 1,
}
# limits keys that are durations in seconds, > 0.
LIMIT_SECONDS: tuple[str, ...] = (
    "header_read_timeout_secs",
    "idle_timeout_secs",
    "upstream_connect_timeout_secs",
    "upstream_request_timeout_secs",
    "upstream_error_body_timeout_secs",
    "pool_idle_timeout_secs",
    "drain_timeout_secs",
    "tls_handshake_timeout_secs",
    "hard_down_cooldown_secs",
    "max_honored_retry_after_secs",
)


@dataclass(frozen=True, slots=True)
class Provider:
    """One upstream endpoint with its credentials. `host` is the bare host (no IPv6 brackets),
    normalised as the SSRF guard checked it; `path_prefix` goes before the codec's upstream path."""

    name: str
    protocol: str
    base_url: str
    scheme: str
    host: str
    port: int
    path_prefix: str
    api_key: str | None
    auth: str
    region: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    # Where credentials come from when they are not api_key (busbar/upstream/aws_credentials.py,
    # gcp_oauth.py). AWS: `profile` of the shared config files, `role_arn` to assume; with neither
    # and no api_key, botocore's default chain. GCP: a service-account JSON (a secret: redacted)
    # and the token endpoint the JWT bearer grant goes to (default: the file's token_uri).
    profile: str | None = None
    role_arn: str | None = None
    gcp_service_account: str | None = None
    token_url: str | None = None
    # The OAuth grants' `scope` (oauth2 = jwt-bearer: cloud-platform unless given;
    # oauth-client-credentials: required) and `subject` (jwt-bearer's `sub` claim, only if set).
    oauth_scope: str | None = None
    oauth_subject: str | None = None
    # Vertex AI: the project and location in every request path.
    vertex_project: str | None = None
    vertex_location: str | None = None
    # Azure OpenAI: a deployment (…/openai/deployments/{d}/…?api-version=…) or, without one, the
    # v1 API (…/openai/v1/…). azure_api_version None means the v1 API's default (none sent).
    azure: bool = False
    azure_deployment: str | None = None
    azure_api_version: str | None = None
    # The catalog's or the provider's `path`: the whole request path after base_url, in place of
    # the protocol's own (/v1/chat/completions, ...), for every request to this provider.
    path: str | None = None
    # `path_base`: for a protocol with the model in the URL on Vertex AI (gemini, anthropic), the
    # base segment its paths go under (`/v1beta/models` replaced; Claude's rawPredict form), as
    # the Rust grammar reaches Vertex AI.
    path_base: str | None = None
    # reliability: provider error code -> error class (stage 1b of SPEC §4.1), and whose key goes
    # upstream: `own` (busbar's) or `passthrough` (the caller's, whose 401/403 is the caller's).
    error_map: tuple[tuple[str, str], ...] = ()
    upstream_credentials: str = "own"
    # reliability: active health probing (busbar/reliability/health.py). Not part of equality: a
    # reload that changes only probing keeps the provider's lanes, permits and breaker cells.
    health: HealthPolicy = field(default=DEFAULT_HEALTH, compare=False)

    def __repr__(self) -> str:
        # Never the key or header values: reprs end up in logs and tracebacks.
        key = None if self.api_key is None else REDACTED
        header_names = tuple(name for name, _ in self.headers)
        return (
            f"Provider(name={self.name!r}, protocol={self.protocol!r}, base_url={self.base_url!r}, "
            f"auth={self.auth!r}, region={self.region!r}, api_key={key!r}, "
            f"headers={header_names!r}"
            + ("" if self.profile is None else f", profile={self.profile!r}")
            + ("" if self.role_arn is None else f", role_arn={self.role_arn!r}")
            + ("" if self.gcp_service_account is None else f", credentials={REDACTED!r}")
            + ("" if self.vertex_project is None else
               f", vertex=({self.vertex_project!r}, {self.vertex_location!r})")
            + ("" if not self.azure else f", azure=({self.azure_deployment!r}, {self.azure_api_version!r})")
            + ("" if self.path is None else f", path={self.path!r}")
            + ("" if self.path_base is None else f", path_base={self.path_base!r}")
            + ")"
        )

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class Model:
    """A model on a provider: one lane. `upstream_model` is the wire id sent upstream."""

    name: str
    provider: Provider
    upstream_model: str
    # What the model serves (busbar/engine/operations.py): a pool request for an operation is
    # only tried on lanes that list it.
    operations: tuple[str, ...] = ("chat",)
    max_concurrent: int | None = None
    default_max_tokens: int | None = None
    reasoning: bool = False
    attempt_timeout_ms: int | None = None
    # `prompt_caching`: the model takes cache markers where a dialect gates them on the model
    # (Bedrock Converse's cachePoint: Claude takes it, Nova refuses it); without it another
    # protocol's cache_control is dropped there, never a translation-made 400.
    prompt_caching: bool = False
    # reliability: lifetime request budget of the lane (SPEC §3); None = unlimited.
    max_requests: int | None = None


@dataclass(frozen=True, slots=True)
class Member:
    """A pool's use of a model. `reasoning` None means the model's own setting applies."""

    model: Model
    weight: int
    reasoning: bool | None = None
    # reliability: the member's context window (tokens), for context-length failover, and its own
    # attempt timeout (overrides the model's).
    context_max: int | None = None
    attempt_timeout_ms: int | None = None
    # The member's tier (primary/overflow split) and free-form tags, as the Rust grammar has them;
    # what a routing strategy reads (issue #40).
    tier: str | None = None
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    members: tuple[Member, ...]
    # reliability (SPEC §4.2, §4.3)
    breaker: BreakerPolicy = DEFAULT_BREAKER
    failover: FailoverPolicy = DEFAULT_FAILOVER
    on_exhausted: OnExhausted = DEFAULT_ON_EXHAUSTED
    # `hooks:` as written (the pool's own after the section-wide `pools.hooks`), its ordering
    # strategy (weighted unless one is named), session affinity's header (None: off) and whose
    # credentials go upstream: the Rust 1.5.3 grammar's pool keys.
    hooks: tuple[str, ...] = ()
    strategy: str = "weighted"
    affinity_header: str | None = None
    upstream_credentials: str = "own"


@dataclass(frozen=True, slots=True)
class Config:
    listen_host: str
    listen_port: int
    workers: int | None
    providers: dict[str, Provider]
    models: dict[str, Model]
    pools: dict[str, Pool]
    limits: Limits
    server_timing: bool
    source: str
    # Non-fatal findings (an empty secret, a mixed-protocol pool) for boot logs and `validate`.
    warnings: tuple[str, ...] = ()
    # busbar/observability/settings.py: Observability (logs, metrics, sinks, traces).
    observability: object = None
    # The control plane (busbar/config/control.py: admin listener, tokens, TLS, overlay) and the
    # parsed document (secrets still as their references), for the admin API's GET config.
    control: object = None
    # busbar/governance/config.py: Governance (virtual keys, groups, rate card, store), or None.
    governance: object = None
    # busbar/hooks/config.py: {name: HookDef}, the top-level `hooks:` definitions.
    hooks: dict = field(default_factory=dict)
    document: dict | None = field(default=None, compare=False, repr=False)
    # The overlay's `groups` and `deleted_groups` as read at load ({"groups": {name: GroupCfg},
    # "deleted_groups": [name]}; None: no overlay applied): groups made over the admin API, which
    # boot imports into the governance store (busbar/governance/overlay_groups.py) rather than
    # merging them into config.yaml's groups, so they stay API groups.
    overlay_groups: dict | None = field(default=None, compare=False, repr=False)
    # `pools.upstream_credentials`: whose key goes upstream for a model named directly (a pool's
    # own `upstream_credentials` is on its Pool, the default already applied).
    upstream_credentials: str = "own"
