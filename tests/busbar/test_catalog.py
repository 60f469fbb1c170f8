"""The provider catalog (issue 36, "The catalog"): busbar's shipped catalog carries every name of
the Rust busbar 1.5.5's, with its protocol, base URL, path and error map; the Rust catalog file
loads here unchanged; which catalog a config uses (providers_file, $BUSBAR_PROVIDERS, providers.yaml
beside the config, the shipped one); and how an entry merges into a provider. What the merged
`path` and `error_map` do on the wire: tests/integration/test_catalog_wire.py."""
from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from busbar import config
from busbar.config import build, load
from busbar.config.checks import Problems

# The Rust catalog at v1.5.5, as stored names -> (protocol, base_url[, path]). Facts only: the
# file itself is read from the mirror below when it is there.
RUST_CATALOG = """
anthropic           anthropic https://api.anthropic.com
z.ai                anthropic https://api.z.ai/api/anthropic
openai              openai    https://api.openai.com
oci-genai           openai    https://inference.generativeai.us-chicago-1.oci.oraclecloud.com/openai
groq                openai    https://api.groq.com/openai
zai-api             openai    https://api.z.ai/api/paas/v4 /chat/completions
together            openai    https://api.together.xyz
fireworks           openai    https://api.fireworks.ai/inference
deepseek            openai    https://api.deepseek.com
mistral             openai    https://api.mistral.ai
xai                 openai    https://api.x.ai
openrouter          openai    https://openrouter.ai/api
cerebras            openai    https://api.cerebras.ai
deepinfra           openai    https://api.deepinfra.com/v1/openai /chat/completions
moonshot            openai    https://api.moonshot.ai
meta-llama          openai    https://api.llama.com/compat
nvidia-nim          openai    https://integrate.api.nvidia.com
sambanova           openai    https://api.sambanova.ai
hyperbolic          openai    https://api.hyperbolic.xyz
novita              openai    https://api.novita.ai/openai
nebius              openai    https://api.tokenfactory.nebius.com
featherless         openai    https://api.featherless.ai
friendliai          openai    https://api.friendli.ai/serverless
scaleway            openai    https://api.scaleway.ai
ovhcloud            openai    https://oai.endpoints.kepler.ai.cloud.ovh.net
nscale              openai    https://inference.api.nscale.com
gmi                 openai    https://api.gmi-serving.com
baseten             openai    https://inference.baseten.co
chutes              openai    https://llm.chutes.ai
dashscope           openai    https://dashscope-intl.aliyuncs.com/compatible-mode
minimax             openai    https://api.minimax.io
sarvam              openai    https://api.sarvam.ai
aimlapi             openai    https://api.aimlapi.com
cometapi            openai    https://api.cometapi.com
nano-gpt            openai    https://nano-gpt.com/api
publicai            openai    https://api.publicai.co
synthetic           openai    https://api.synthetic.new/openai
wandb               openai    https://api.inference.wandb.ai
digitalocean        openai    https://inference.do-ai.run
github-models       openai    https://models.github.ai/inference /chat/completions
huggingface         openai    https://router.huggingface.co
siliconflow         openai    https://api.siliconflow.com
upstage             openai    https://api.upstage.ai
stepfun             openai    https://api.stepfun.ai
zhipuai             openai    https://open.bigmodel.cn/api/paas/v4 /chat/completions
xiaomi              openai    https://api.xiaomimimo.com
vultr               openai    https://api.vultrinference.com
ollama-cloud        openai    https://ollama.com
inception           openai    https://api.inceptionlabs.ai
morph               openai    https://api.morphllm.com
longcat             openai    https://api.longcat.chat/openai
sakana              openai    https://api.sakana.ai
nearai              openai    https://cloud-api.near.ai
302ai               openai    https://api.302.ai
abacus              openai    https://routellm.abacus.ai
abliteration-ai     openai    https://api.abliteration.ai
ambient             openai    https://api.ambient.xyz
anyapi              openai    https://api.anyapi.ai
auriko              openai    https://api.auriko.ai
bailing             openai    https://api.ant-ling.com
berget              openai    https://api.berget.ai
clarifai            openai    https://api.clarifai.com/v2/ext/openai
claudinio           openai    https://api.claudin.io
cloudferro-sherlock openai    https://api-sherlock.cloudferro.com/openai
cortecs             openai    https://api.cortecs.ai
crof                openai    https://crof.ai
crossmodel          openai    https://api.crossmodel.ai
dinference          openai    https://api.dinference.com
drun                openai    https://chat.d.run
evroc               openai    https://models.think.evroc.com
fastrouter          openai    https://api.fastrouter.ai/api
frogbot             openai    https://app.frogbot.ai/api
helicone            openai    https://ai-gateway.helicone.ai
hpc-ai              openai    https://api.hpc-ai.com/inference
iflowcn             openai    https://apis.iflow.cn
inceptron           openai    https://api.inceptron.io
inference           openai    https://api.inference.net
io-net              openai    https://api.intelligence.io.solutions/api
jiekou              openai    https://api.jiekou.ai/openai
kenari              openai    https://kenari.id
kilo                openai    https://api.kilo.ai/api/gateway /chat/completions
lilac               openai    https://api.getlilac.com
llmgateway          openai    https://api.llmgateway.io
llmtr               openai    https://llmtr.com
meganova            openai    https://api.meganova.ai
mixlayer            openai    https://models.mixlayer.ai
moark               openai    https://api.moark.ai
modelscope          openai    https://api-inference.modelscope.cn
neuralwatt          openai    https://api.neuralwatt.com
opencode            openai    https://opencode.ai/zen
opencode-go         openai    https://opencode.ai/zen/go
orcarouter          openai    https://api.orcarouter.ai
poe                 openai    https://api.poe.com
qihang-ai           openai    https://api.qhaigc.net
qiniu-ai            openai    https://api.qnaigc.com
regolo-ai           openai    https://api.regolo.ai
requesty            openai    https://router.requesty.ai
stackit             openai    https://api.openai-compat.model-serving.eu01.onstackit.cloud
stepfun-ai          openai    https://api.stepfun.ai
submodel            openai    https://llm.submodel.ai
tencent-tokenhub    openai    https://tokenhub-intl.tencentcloudmaas.com
the-grid-ai         openai    https://api.thegrid.ai
tinfoil             openai    https://inference.tinfoil.sh
trustedrouter       openai    https://api.trustedrouter.com
umans-ai            openai    https://api.code.umans.ai
wafer.ai            openai    https://pass.wafer.ai
xpersona            openai    https://www.xpersona.co
zeldoc              openai    https://api.zeldoc.ai
zenifra             openai    https://ai.zenifra.com
zenmux              openai    https://zenmux.ai/api
responses           responses https://api.openai.com
gemini              gemini    https://generativelanguage.googleapis.com
bedrock             bedrock   https://bedrock-runtime.us-east-1.amazonaws.com
cohere              cohere    https://api.cohere.com
"""
RUST = {line.split()[0]: tuple(line.split()[1:]) for line in RUST_CATALOG.strip().splitlines()}

# The Rust repository, mirrored bare, and its v1.5.5 commit.
RUST_MIRROR = os.environ.get("BUSBAR_RUST_MIRROR", "/work/.mirror/GetBusbar+busbar/repo")
RUST_COMMIT = "1a74c3b6"

# busbar's own entries, and its older names for providers the Rust catalog names otherwise.
BUSBAR_ONLY = {"ai21", "azure-openai", "bedrock-invoke", "kluster", "lmstudio", "ollama", "venice",
               "vertex", "vertex-anthropic", "vllm"}
ALIASES = {"friendli": "friendliai", "inference-net": "inference", "nvidia": "nvidia-nim",
           "openai-responses": "responses", "zai": "z.ai"}


def shipped() -> dict:
    out = Problems()
    catalog = config.load_catalog(config.SHIPPED_CATALOG, out)
    assert out.errors == [] and out.warnings == []
    return catalog


@pytest.fixture(scope="module")
def rust_file(tmp_path_factory):
    """The Rust project's providers.yaml at v1.5.5, copied out of the mirror for this run."""
    if not os.path.isdir(RUST_MIRROR):
        pytest.skip(f"the Rust busbar mirror is not at {RUST_MIRROR} (set BUSBAR_RUST_MIRROR)")
    run = subprocess.run(["git", "-C", RUST_MIRROR, "show", f"{RUST_COMMIT}:providers.yaml"],
                         capture_output=True)
    if run.returncode != 0:
        pytest.skip(f"the mirror has no providers.yaml at {RUST_COMMIT}: {run.stderr.decode()[:200]}")
    path = tmp_path_factory.mktemp("rust") / "providers.yaml"
    path.write_bytes(run.stdout)
    return path


# --- the shipped catalog ------------------------------------------------------------------------


def test_the_shipped_catalog_has_every_rust_name_with_its_protocol_base_url_and_path():
    catalog = shipped()
    assert len(RUST) == 114
    for name, (protocol, base_url, *path) in RUST.items():
        entry = catalog.get(name)
        assert entry is not None, name
        assert (entry["protocol"], entry["base_url"], entry["path"]) == (
            protocol, base_url, path[0] if path else None), name
    assert set(catalog) == set(RUST) | BUSBAR_ONLY | set(ALIASES)
    assert sorted(n for n, e in catalog.items() if e["path"]) == [
        "deepinfra", "github-models", "kilo", "zai-api", "zhipuai"]


def test_the_shipped_error_maps_carry_the_rust_values():
    catalog = shipped()
    em = {name: dict(entry["error_map"]) for name, entry in catalog.items()}
    assert em["openai"] == {"insufficient_quota": "billing", "rate_limit_exceeded": "rate_limit"}
    assert em["z.ai"] == em["zai-api"] == {"1113": "billing", "1302": "rate_limit"}
    assert em["zhipuai"]["1309"] == "billing" and em["zhipuai"]["1313"] == "rate_limit"
    assert em["gemini"] == {"RESOURCE_EXHAUSTED": "rate_limit"}
    assert em["bedrock"] == {"ThrottlingException": "rate_limit",
                             "ServiceQuotaExceededException": "billing"}
    assert em["moonshot"]["exceeded_current_quota_error"] == "billing"
    assert em["anthropic"] == em["cohere"] == em["deepseek"] == {}
    classes = {cls for m in em.values() for cls in m.values()}
    assert classes == {"billing", "rate_limit"}
    assert sum(len(em[n]) for n in RUST) == 80      # 31 billing + 49 rate_limit codes


def test_older_busbar_names_are_the_same_entries():
    catalog = shipped()
    for old, new in ALIASES.items():
        assert catalog[old] == catalog[new], old


def test_every_shipped_base_url_passes_the_ssrf_guard():
    from busbar.config.urls import HostPolicy, parse_base_url
    for name, entry in shipped().items():
        parsed = parse_base_url(entry["base_url"], HostPolicy())
        assert not isinstance(parsed, str), (name, parsed)
        if name in ("ollama", "vllm", "lmstudio"):
            assert parsed.scheme == "http" and parsed.host == "127.0.0.1", name
        else:
            assert parsed.scheme == "https", name


def test_every_rust_name_deploys_with_only_a_key():
    lines = ["providers:"]
    for name, (protocol, *_) in RUST.items():
        key = "AK:SK" if protocol == "bedrock" else "k"
        lines.append(f"  {name}: {{api_key: {{env: {'AWS' if key == 'AK:SK' else 'K'}}}}}")
    c = load(text="\n".join(lines) + "\nmodels: {}\n", env={"K": "k", "AWS": "AK:SK"})
    assert set(c.providers) == set(RUST)
    p = c.providers["zai-api"]
    assert (p.base_url, p.path_prefix, p.path) == ("https://api.z.ai/api/paas/v4", "/api/paas/v4",
                                                   "/chat/completions")
    assert dict(p.error_map) == {"1113": "billing", "1302": "rate_limit"}
    assert c.providers["nebius"].host == "api.tokenfactory.nebius.com"
    assert c.providers["stepfun"].host == "api.stepfun.ai"
    assert c.providers["z.ai"].auth == "bearer"


# --- the Rust file, unchanged -------------------------------------------------------------------


def test_the_rust_catalog_loads_unchanged(rust_file):
    out = Problems()
    catalog = config.load_catalog(str(rust_file), out)
    assert out.errors == [] and out.warnings == []
    assert len(catalog) == 114
    ours = shipped()
    for name, entry in catalog.items():
        mine = ours[name]
        for key in ("protocol", "base_url", "path", "error_map"):
            assert entry[key] == mine[key], (name, key)


def test_a_config_deploying_every_rust_provider_validates_against_the_rust_file(rust_file, tmp_path):
    lines = [f"providers_file: {rust_file}", "providers:"]
    for name, (protocol, *_) in RUST.items():
        lines.append(f"  {name}: {{api_key: {{env: {'AWS' if protocol == 'bedrock' else 'K'}}}}}")
    cfg = tmp_path / "config.yaml"
    cfg.write_text("\n".join(lines) + "\nmodels: {}\n")
    c, out = build(str(cfg), env={"K": "k", "AWS": "AK:SK"})
    assert out.errors == [] and out.warnings == []
    assert len(c.providers) == 114


# --- which catalog ------------------------------------------------------------------------------

CORP = "corp:\n  protocol: openai\n  base_url: https://{host}\n"
USES_CORP = "providers:\n  corp: {api_key: {env: K}}\nmodels: {}\n"


def corp_host(path, env=None, text=None, **kw):
    e = {"K": "k", **(env or {})}
    if text is not None:
        c, out = build(text=text, env=e, **kw)
    else:
        c, out = build(str(path), env=e, **kw)
    assert out.errors == [], out.errors
    return c.providers["corp"].host, out.warnings


def test_a_catalog_beside_the_config_is_read_by_default(tmp_path):
    (tmp_path / "providers.yaml").write_text(CORP.format(host="beside.example"))
    (tmp_path / "config.yaml").write_text(USES_CORP)
    assert corp_host(tmp_path / "config.yaml") == ("beside.example", [])
    # It replaces the shipped catalog: a shipped name is not there.
    (tmp_path / "config.yaml").write_text("providers:\n  groq: {api_key: {env: K}}\nmodels: {}\n")
    c, out = build(str(tmp_path / "config.yaml"), env={"K": "k"})
    assert out.errors[0].startswith("providers.groq: missing required key 'protocol'")


def test_no_catalog_beside_the_config_means_the_shipped_one(tmp_path):
    (tmp_path / "config.yaml").write_text("providers:\n  groq: {api_key: {env: K}}\nmodels: {}\n")
    c, out = build(str(tmp_path / "config.yaml"), env={"K": "k"})
    assert out.errors == [] and c.providers["groq"].host == "api.groq.com"


def test_text_configs_look_beside_only_when_given_a_folder(tmp_path, monkeypatch):
    (tmp_path / "providers.yaml").write_text(CORP.format(host="beside.example"))
    # The admin API builds a posted config as text in the running config's folder: same catalog.
    assert corp_host(None, text=USES_CORP, base_dir=str(tmp_path))[0] == "beside.example"
    # An embedded config (the demo, load(text=...)) has no folder: the working one is not looked in.
    monkeypatch.chdir(tmp_path)
    c, out = build(text="providers:\n  groq: {api_key: {env: K}}\nmodels: {}\n", env={"K": "k"})
    assert out.errors == [] and c.providers["groq"].host == "api.groq.com"


def test_providers_file_wins_over_the_deprecated_variable_and_the_file_beside(tmp_path):
    (tmp_path / "providers.yaml").write_text(CORP.format(host="beside.example"))
    (tmp_path / "named.yaml").write_text(CORP.format(host="named.example"))
    (tmp_path / "env.yaml").write_text(CORP.format(host="env.example"))
    env = {"BUSBAR_PROVIDERS": str(tmp_path / "env.yaml")}
    # providers_file: is relative to the config's folder, and wins over both.
    (tmp_path / "config.yaml").write_text("providers_file: named.yaml\n" + USES_CORP)
    assert corp_host(tmp_path / "config.yaml") == ("named.example", [])
    assert corp_host(tmp_path / "config.yaml", env) == (
        "named.example",
        ["BUSBAR_PROVIDERS: deprecated, and ignored: providers_file: in config.yaml wins"])
    # Without it, the variable wins over the file beside, with a warning.
    (tmp_path / "config.yaml").write_text(USES_CORP)
    assert corp_host(tmp_path / "config.yaml", env) == (
        "env.example", ["BUSBAR_PROVIDERS: deprecated; set providers_file: in config.yaml instead"])


def test_a_named_catalog_that_cannot_be_read_is_fatal(tmp_path):
    (tmp_path / "config.yaml").write_text("providers_file: nope.yaml\n" + USES_CORP)
    c, out = build(str(tmp_path / "config.yaml"), env={"K": "k"})
    assert out.errors[0] == f"{tmp_path / 'nope.yaml'}: cannot read provider catalog: No such file or directory"
    c, out = build(str(tmp_path / "config.yaml"), env={"K": "k", "BUSBAR_PROVIDERS": "/nonexistent/p.yaml"})
    assert out.errors[0].startswith(f"{tmp_path / 'nope.yaml'}: cannot read")


# --- the entry format ---------------------------------------------------------------------------


def catalog_of(tmp_path, text: str, env=None) -> tuple[dict, Problems]:
    path = tmp_path / "cat.yaml"
    path.write_text(textwrap.dedent(text))
    out = Problems()
    return config.load_catalog(str(path), out, env=env or {}), out


def test_every_reference_field_is_read(tmp_path):
    catalog, out = catalog_of(tmp_path, """
        gemini-vertex:
          protocol: gemini
          base_url: https://us-central1-aiplatform.googleapis.com
          path_base: /v1/projects/p/locations/us-central1/publishers/google/models
          auth: jwt-bearer
          subject: someone@example.com
          error_map: {RESOURCE_EXHAUSTED: rate_limit}
        azure-entra:
          protocol: openai
          base_url: https://r.openai.azure.com
          path: /openai/deployments/gpt-4o/chat/completions?api-version=2024-06-01
          auth: oauth-client-credentials
          token_url: https://login.microsoftonline.com/t/oauth2/v2.0/token
          scope: https://cognitiveservices.azure.com/.default
          health: {mode: dead, interval_secs: 10}
          allow_metadata_hosts: [metadata.internal.example]
        """)
    assert out.errors == [] and out.warnings == []
    assert catalog["gemini-vertex"]["path_base"].endswith("/publishers/google/models")
    assert catalog["gemini-vertex"]["error_map"] == (("RESOURCE_EXHAUSTED", "rate_limit"),)
    entra = catalog["azure-entra"]
    assert entra["path"] == "/openai/deployments/gpt-4o/chat/completions?api-version=2024-06-01"
    assert (entra["auth"], entra["scope"]) == ("oauth-client-credentials",
                                               "https://cognitiveservices.azure.com/.default")
    assert entra["allow_metadata_hosts"] == frozenset({"metadata.internal.example"})


def test_unknown_catalog_keys_are_ignored_with_a_warning(tmp_path):
    catalog, out = catalog_of(tmp_path, """
        a:
          protocol: openai
          base_url: https://a.example
          error-map: {x: billing}
          api_key: {env: A_KEY}
        """)
    cat = tmp_path / "cat.yaml"
    assert out.errors == []
    assert out.warnings == [
        f"{cat}: a.error-map: unknown catalog key, ignored (did you mean 'error_map'?)",
        f"{cat}: a.api_key: unknown catalog key, ignored; the key goes in config.yaml (providers.a.api_key)",
    ]
    assert catalog["a"]["error_map"] == ()


def test_broken_entries_are_refused_under_the_catalog_path(tmp_path):
    catalog, out = catalog_of(tmp_path, """
        a: {protocol: soap, base_url: https://a.example}
        b: {protocol: openai}
        c: {protocol: openai, base_url: https://c.example, error_map: {"1113": bills}}
        d: {protocol: openai, base_url: https://d.example, path: chat/completions}
        e: {protocol: openai, base_url: https://e.example, path: "/chat completions#x"}
        f: {protocol: openai, base_url: https://f.example, auth: kerberos}
        g: {protocol: openai, base_url: https://g.example, error_map: {x: network}}
        """)
    cat = tmp_path / "cat.yaml"
    assert out.errors == [
        f"{cat}: a.protocol: unknown protocol 'soap'",
        f"{cat}: b: missing required key 'base_url'",
        f"{cat}: c.error_map.1113: expected one of rate_limit, overloaded, server_error, timeout, "
        "network, auth, billing, client_error, context_length",
        f"{cat}: d.path: must start with '/' (it is the whole request path after base_url)",
        f"{cat}: e.path: a path is ASCII letters, digits and -._~%!$&'()*+,;=:@/? (no spaces, no "
        "'#', percent-encode anything else)",
        f"{cat}: f.auth: unknown auth 'kerberos'",
    ]
    assert set(catalog) == {"g"}


def test_a_base_url_is_checked_where_a_provider_uses_it(tmp_path):
    # The reference checks a catalog's base_url with the SSRF guard on use, not when reading it:
    # an unused http:// entry (a local server on a host name) does not stop the gateway.
    (tmp_path / "providers.yaml").write_text(
        "local: {protocol: openai, base_url: 'http://ollama:11434'}\n"
        "corp: {protocol: openai, base_url: 'https://corp.example'}\n")
    (tmp_path / "config.yaml").write_text(USES_CORP)
    assert corp_host(tmp_path / "config.yaml")[0] == "corp.example"
    (tmp_path / "config.yaml").write_text("providers:\n  local: {api_key: {env: K}}\nmodels: {}\n")
    c, out = build(str(tmp_path / "config.yaml"), env={"K": "k"})
    assert out.errors == ["providers.local (catalog base_url): http:// is allowed only for loopback "
                          "and private hosts; use https://"]


def test_the_catalog_is_interpolated_like_the_config(tmp_path):
    catalog, out = catalog_of(tmp_path, "a: {protocol: openai, base_url: 'https://${HOST}'}\n",
                              env={"HOST": "llm.corp.example"})
    assert out.errors == [] and catalog["a"]["base_url"] == "https://llm.corp.example"
    catalog, out = catalog_of(tmp_path, "a: {protocol: openai, base_url: 'https://${HOST}'}\n")
    assert out.errors == [f"{tmp_path / 'cat.yaml'}: ${{HOST}}: environment variable is not set (line 1)"]
    catalog, out = catalog_of(tmp_path, "a: {protocol: openai, base_url: ${HOST}}\n",
                              env={"HOST": "{x: 1}"})
    assert out.errors[0].endswith("an interpolated ${VAR} value changes the YAML structure (it "
                                  "contains YAML syntax such as ': ', '[', '{' or '#'); quote the "
                                  "${VAR} in the file")


# --- how an entry merges into a provider --------------------------------------------------------


def deploy(tmp_path, catalog_text: str, providers_text: str, env=None):
    (tmp_path / "providers.yaml").write_text(textwrap.dedent(catalog_text))
    (tmp_path / "config.yaml").write_text("providers:\n" + textwrap.indent(
        textwrap.dedent(providers_text), "  ") + "models: {}\n")
    return build(str(tmp_path / "config.yaml"), env={"K": "k", **(env or {})})


def test_the_providers_error_map_merges_over_the_catalogs(tmp_path):
    c, out = deploy(tmp_path, """
        acme:
          protocol: openai
          base_url: https://acme.example
          error_map: {"1113": billing, "1302": rate_limit}
        """, """
        acme: {api_key: {env: K}, error_map: {"1302": server_error, quota_gone: billing}}
        other: {catalog: acme, api_key: {env: K}}
        """)
    assert out.errors == []
    assert dict(c.providers["acme"].error_map) == {
        "1113": "billing", "1302": "server_error", "quota_gone": "billing"}
    assert dict(c.providers["other"].error_map) == {"1113": "billing", "1302": "rate_limit"}


def test_the_catalogs_allow_list_is_the_default_the_providers_own_replaces(tmp_path):
    c, out = deploy(tmp_path, """
        acme:
          protocol: openai
          base_url: https://acme.example/api/v4
          allow_metadata_hosts: [metadata.google.internal]
        """, """
        mine: {catalog: acme, api_key: {env: K}, base_url: "https://metadata.google.internal/x"}
        theirs: {catalog: acme, api_key: {env: K}, allow_metadata_hosts: [],
                 base_url: "https://metadata.google.internal/x"}
        """)
    assert out.errors == ["providers.theirs.base_url: host metadata.google.internal is a cloud "
                          "metadata endpoint, refused by the SSRF guard (allow it with "
                          "allow_metadata_hosts)"]


def test_a_path_from_the_catalog(tmp_path):
    c, out = deploy(tmp_path, """
        acme: {protocol: openai, base_url: https://acme.example/api/v4, path: /chat/completions}
        """, """
        acme: {api_key: {env: K}}
        moved: {catalog: acme, api_key: {env: K}, base_url: "https://other.example/v9"}
        """)
    assert out.errors == []
    assert (c.providers["acme"].path_prefix, c.providers["acme"].path) == ("/api/v4", "/chat/completions")
    assert (c.providers["moved"].path_prefix, c.providers["moved"].path) == ("/v9", "/chat/completions")
    assert "path='/chat/completions'" in repr(c.providers["acme"])


def test_what_a_catalog_entry_cannot_be_given_is_refused_where_it_is_used(tmp_path):
    c, out = deploy(tmp_path, """
        entra: {protocol: openai, base_url: https://r.openai.azure.com, auth: oauth-client-credentials,
                token_url: "https://login.example/t"}
        az: {protocol: openai, base_url: https://r.openai.azure.com, auth: api-key, azure: {},
             path: /chat/completions}
        unused: {protocol: openai, base_url: https://u.example, auth: jwt-bearer}
        """, """
        entra: {api_key: {env: K}}
        az: {api_key: {env: K}}
        """, env={"K": "id:secret"})
    assert out.errors == [
        "providers.entra (catalog auth): auth 'oauth-client-credentials' needs scope",
        "providers.az (catalog path): a path replaces the Azure OpenAI URL scheme; give either path "
        "or azure:",
    ]
    # the catalog's OAuth entries serve a provider that gives what they need
    c, out = deploy(tmp_path, """
        entra: {protocol: openai, base_url: https://r.openai.azure.com, auth: oauth-client-credentials,
                token_url: "https://login.example/t", scope: s}
        """, """
        entra: {api_key: {env: K}}
        """, env={"K": "id:secret"})
    assert out.errors == []
    p = c.providers["entra"]
    assert (p.auth, p.token_url, p.oauth_scope) == ("oauth-client-credentials",
                                                     "https://login.example/t", "s")


def test_a_catalog_path_base_is_the_providers(tmp_path):
    c, out = deploy(tmp_path, """
        gv: {protocol: gemini, base_url: https://aiplatform.googleapis.com, path_base: /v1/p/models}
        """, """
        gv: {api_key: {env: K}}
        own: {catalog: gv, api_key: {env: K}, path_base: /v1/q/models}
        """)
    assert out.errors == []
    assert (c.providers["gv"].path_base, c.providers["own"].path_base) == ("/v1/p/models",
                                                                          "/v1/q/models")
