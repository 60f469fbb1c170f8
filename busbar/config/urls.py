"""Upstream base URLs: parsing and the SSRF guard (SPEC §8).

A base_url decides where busbar sends requests carrying provider keys, so it is checked the way an
attacker would try to dodge a check: the host is percent-decoded, lower-cased, stripped of its
trailing dot, and IPv4 written in decimal, hex, octal or short form (`2852039166`, `0xa9fea9fe`,
`169.254.43518`) or IPv4-mapped IPv6 (`::ffff:169.254.169.254`) is reduced to its address before the
denylist is consulted. The normalised host is what the upstream client connects to, so what was
checked is what is used. Backslashes, whitespace and userinfo are refused outright rather than
normalised: no legitimate base_url has them.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

# Cloud metadata services (instance credentials live there): AWS/GCP/Azure/OpenStack link-local,
# Alibaba, Azure's wireserver, Oracle's 192.0.0.192, AWS's IPv6 IMDS.
DENIED_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "169.254.0.0/16",
        "100.100.100.200/32",
        "168.63.129.16/32",
        "192.0.0.192/32",
        "fd00:ec2::254/128",
    )
)
DENIED_HOSTS = frozenset(
    {
        "metadata.google.internal",
        "metadata.internal",
        "metadata.tencentyun.com",
        "metadata.platformequinix.com",
        "instance-data",
        "instance-data.ec2.internal",
    }
)

# Where plain http:// is acceptable: the request never leaves the host or the private network
# (Ollama, vLLM, a sidecar). Public hosts must use https: provider keys travel in headers.
_PLAIN_HTTP_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "::1/128", "fc00::/7")
)

_DEFAULT_PORTS = {"https": 443, "http": 80}
_NUMBER = re.compile(r"(0x[0-9a-f]*|[0-9]+)\Z")
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\Z")
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f\\]")


@dataclass(frozen=True, slots=True)
class BaseURL:
    base_url: str  # normalised, no trailing slash
    scheme: str
    host: str  # bare: no IPv6 brackets
    port: int
    path_prefix: str  # "" or "/..." without trailing slash


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """Overrides of the metadata denylist: `security:` globally, `allow_metadata_hosts` per
    provider. Allow always wins over block."""

    blocked: frozenset[str] = frozenset()
    allowed: frozenset[str] = frozenset()
    allow_all: bool = False

    def with_allowed(self, hosts: frozenset[str]) -> "HostPolicy":
        if not hosts:
            return self
        return HostPolicy(self.blocked, self.allowed | hosts, self.allow_all)


def normalize_host(host: str) -> str:
    """The comparable form of a host name or address, as used by the denylist and allow lists."""
    host = unquote(host).strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.endswith("."):
        host = host[:-1]
    ip = _parse_ip(host)
    if isinstance(ip, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return str(ip)
    return host


def _parse_ipv4_loose(host: str):
    """inet_aton(3) semantics: 1-4 parts, each decimal, 0x-hex or 0-octal, the last part filling
    the remaining bytes. Returns an IPv4Address, or an error string."""
    parts = host.split(".")
    if len(parts) > 4:
        return "invalid IPv4 address"
    values = []
    for part in parts:
        if not _NUMBER.match(part):
            return "invalid IPv4 address"
        try:
            if part.startswith("0x"):
                values.append(int(part[2:] or "0", 16))
            elif len(part) > 1 and part.startswith("0"):
                values.append(int(part, 8))
            else:
                values.append(int(part, 10))
        except ValueError:
            return "invalid IPv4 address"
    last = values.pop()
    if any(v > 255 for v in values) or last >= 256 ** (4 - len(values)):
        return "invalid IPv4 address"
    number = last
    for i, v in enumerate(values):
        number += v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def _parse_ip(host: str):
    """An address for IP hosts, None for names, an error string for malformed addresses."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            return "invalid IPv6 address"
    labels = host.split(".")
    # WHATWG URL rule: a host whose last label is numeric is an IPv4 address or invalid.
    if labels and _NUMBER.match(labels[-1]):
        return _parse_ipv4_loose(host)
    return None


def _is_denied(host: str, ip, policy: HostPolicy) -> bool:
    if policy.allow_all or host in policy.allowed:
        return False
    if host in DENIED_HOSTS or host in policy.blocked:
        return True
    if ip is not None:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            mapped = ip.ipv4_mapped
            if str(mapped) in policy.allowed:
                return False
            if str(mapped) in policy.blocked:
                return True
            ip = mapped
        return any(ip in net for net in DENIED_NETWORKS if net.version == ip.version)
    return False


def allows_plain_http(host: str, ip) -> bool:
    if ip is None:
        return host == "localhost" or host.endswith(".localhost")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in _PLAIN_HTTP_NETWORKS if net.version == ip.version)


def parse_base_url(raw: object, policy: HostPolicy) -> BaseURL | str:
    """The parsed URL, or a message saying why it is refused."""
    if not isinstance(raw, str) or not raw:
        return "expected a URL string"
    if _BAD_CHARS.search(raw) or not raw.isascii():
        return "must be an ASCII URL without whitespace, control characters or backslashes"
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError:
        # Never the parser's message: it quotes the offending part, which may have come from a
        # ${VAR} (interpolated values are never echoed).
        return "is not a valid URL (the port must be a number 1-65535)" if ":" in raw.split(
            "//", 1)[-1].split("/", 1)[0] else "is not a valid URL"
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        return "must start with https:// (or http:// for a loopback or private host)"
    if "@" in parts.netloc:
        return "must not carry credentials (user:password@); use api_key"
    if parts.query or parts.fragment or raw.endswith(("?", "#")):
        return "must not have a query string or fragment"
    if not parts.hostname:
        return "has no host"
    if port == 0:
        return "port must be 1-65535"
    host = unquote(parts.hostname).lower()
    if "%" in host:
        return "host must not carry an IPv6 zone or percent-escapes"
    if host.endswith("."):
        host = host[:-1]
    ip = _parse_ip(host)
    if isinstance(ip, str):
        return f"host is an {ip}"
    if ip is None:
        if len(host) > 253 or not all(_LABEL.match(label) for label in host.split(".")):
            return "host is not a valid DNS name"
    else:
        host = str(ip)
        check = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip
        if check.is_unspecified or check.is_multicast or str(check) == "255.255.255.255":
            return f"host {host} is not a unicast address"
    if _is_denied(host, ip, policy):
        return (
            f"host {host} is a cloud metadata endpoint, refused by the SSRF guard "
            "(allow it with allow_metadata_hosts)"
        )
    if scheme == "http" and not allows_plain_http(host, ip):
        return "http:// is allowed only for loopback and private hosts; use https://"
    segments = parts.path.split("/")
    if "." in segments or ".." in segments or "%2e" in parts.path.lower():
        return "path must not contain '.' or '..' segments"
    path_prefix = parts.path.rstrip("/")
    if "//" in path_prefix:
        return "path must not contain empty segments ('//')"
    if port is None:
        port = _DEFAULT_PORTS[scheme]
        netloc = f"[{host}]" if ":" in host else host
    else:
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return BaseURL(f"{scheme}://{netloc}{path_prefix}", scheme, host, port, path_prefix)


# observability sinks (request-log webhooks, OTLP): stricter than upstream base URLs. An upstream
# on a private network is a deliberate deployment (vLLM, Ollama); a sink URL is where busbar POSTs
# request records on its own initiative, so it must not reach into the private network, the
# carrier-grade NAT range, link-local or a metadata service. Loopback stays allowed (a collector
# sidecar on the same host) and is the only place plain http:// may go.
_SINK_DENIED_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
              "fc00::/7", "fe80::/10", "0.0.0.0/8")
)


def parse_sink_url(raw: object) -> BaseURL | str:
    """A sink URL (request-log webhook, OTLP endpoint) parsed with the base-URL rules plus the sink
    rules above; the URL may carry a path. The literal is checked here; a name is not resolved
    (busbar validate runs with no network)."""
    parsed = parse_base_url(raw, HostPolicy())
    if isinstance(parsed, str):
        return parsed
    ip = _parse_ip(parsed.host)
    if ip is not None:
        check = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip
        if any(check in net for net in _SINK_DENIED_NETWORKS if net.version == check.version):
            return (f"host {parsed.host} is a private, CGNAT or link-local address, refused for "
                    "a sink by the SSRF guard")
        loopback = check.is_loopback
    else:
        loopback = parsed.host == "localhost" or parsed.host.endswith(".localhost")
    if parsed.scheme == "http" and not loopback:
        return "http:// is allowed only for a loopback sink; use https://"
    return parsed
