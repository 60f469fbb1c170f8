"""The Helm chart (packaging/helm/busbar) and its plain rendering (packaging/k8s/busbar.yaml),
without a cluster or network: the chart is rendered by Helm itself (the Go SDK, through
helm-python-sdk's binding to libhelm_c: the install action in client dry-run mode, which is what
`helm template` runs) and every object is validated against the Kubernetes API's schemas in strict
mode (kubernetes-validate, which ships them). Then the properties the chart exists for are asserted
one by one, so removing one fails here: non-root, read-only root filesystem with a writable,
executable /tmp, probes, the two Services, the Redis URL from a Secret, a config busbar accepts.

    python tests/packaging/test_helm.py --write-plain    # rewrites packaging/k8s/busbar.yaml
"""
from __future__ import annotations

import copy
import functools
import os
import re
import sys
from dataclasses import dataclass

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(ROOT, "packaging", "helm", "busbar")
PLAIN = os.path.join(ROOT, "packaging", "k8s", "busbar.yaml")

# The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion; preStop's sleep action is on
# by default from 1.30) and the newest whose schemas kubernetes-validate ships.
KUBE_MIN = "1.30.0"
KUBE_VERSIONS = (KUBE_MIN, kubernetes_validate.utils.latest_version() + ".0")


# ------------------------------------------------------------------------------ rendering by Helm
class DuplicateKey(ValueError):
    pass


class _StrictLoader(yaml.SafeLoader):
    """YAML with duplicate keys refused: Helm parses a rendered manifest only for its kind and
    name, and keeps the last of two equal keys; the API server's strict field validation refuses
    them."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise DuplicateKey(f"duplicate key {key!r} at line {key_node.start_mark.line + 1}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml_strict(text: str):
    return yaml.load(text, Loader=_StrictLoader)


@dataclass
class Rendered:
    manifest: str       # as `helm template` prints it: install order, a `# Source:` line each
    objects: list       # [(template path, object)], in that order
    notes: str          # NOTES.txt, rendered

    def of_kind(self, kind: str) -> list:
        return [obj for _, obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str) -> dict:
        found = self.of_kind(kind)
        if len(found) != 1:
            raise AssertionError(f"expected one {kind}, found {len(found)}")
        return found[0]


@functools.cache
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def render(values: dict | None = None, release: str = "busbar",
           namespace: str = "default") -> Rendered:
    """`helm template <release> packaging/helm/busbar --namespace <namespace> -f <values>`. A
    template error (`required`, a nil pointer, YAML that does not parse) raises
    helm.HelmReleaseError with Helm's message. Memory storage: nothing is kept, and client dry-run
    contacts no cluster."""
    with helm.Config(namespace=namespace, storage_driver="memory") as cfg:
        rel = cfg.install(chart(), release, values or {}, namespace=namespace, dry_run="client")
    manifest = rel["manifest"].strip() + "\n"      # what `helm template` prints
    # Helm writes each document (one per object, a template's `---` split) as
    # "---\n# Source: <template path>\n<document>\n".
    parts = re.split(r"(?m)^---\n# Source: (.+)\n", manifest)
    assert parts[0] == "", parts[0]
    objects = []
    for source, doc in zip(parts[1::2], parts[2::2]):
        obj = load_yaml_strict(doc)
        assert isinstance(obj, dict) and {"apiVersion", "kind"} <= obj.keys(), (source, doc)
        objects.append((source, obj))
    return Rendered(manifest, objects, rel["notes"])


PLAIN_HEADER = """\
# busbar as plain Kubernetes manifests: packaging/helm/busbar rendered with its default values
# (`helm template busbar packaging/helm/busbar`), for
# `kubectl apply -n <namespace> -f packaging/k8s/busbar.yaml`.
# Generated; do not edit: change the chart and run
#   python tests/packaging/test_helm.py --write-plain
# (tests/packaging/test_helm.py fails while this file is out of date).
#
# Before applying, create the Secret the pods read (not included here; see docs/kubernetes.md):
#   kubectl create secret generic busbar \\
#     --from-literal=BUSBAR_REDIS_URL=redis://redis:6379/0 \\
#     --from-literal=BUSBAR_SIGNING_KEY=$(openssl rand -hex 32) \\
#     --from-literal=BUSBAR_ADMIN_TOKEN=$(openssl rand -hex 24) \\
#     --from-literal=OPENAI_API_KEY=sk-...
"""


def plain_manifest() -> str:
    return PLAIN_HEADER + render().manifest


# Everything the defaults leave off, turned on or away from the default.
OTHER_VALUES = {
    "fullnameOverride": "llm-gateway",
    "autoscaling": {"enabled": False},
    "replicaCount": 3,
    "workers": 2,
    "resources": {"requests": {"cpu": "1", "memory": "128Mi"},
                  "limits": {"cpu": "2", "memory": "512Mi"}},
    "secret": {"existingSecret": "gateway-env"},
    "redis": {"secretName": "redis-connection", "secretKey": "url"},
    "admin": {"mtls": {"enabled": True, "secretName": "busbar-admin-tls"}},
    "probes": {"scheme": "HTTPS"},
    "preStopSleepSeconds": 0,
    "tmp": {"medium": "Memory", "sizeLimit": "160Mi"},
    "serviceAccount": {"create": False, "name": "gateway"},
    "podAnnotations": {"prometheus.io/scrape": "true"},
    "podLabels": {"team": "platform"},
    "imagePullSecrets": [{"name": "registry"}],
    "service": {"type": "LoadBalancer", "annotations": {"example.com/lb": "internal"}},
    "adminService": {"annotations": {"example.com/admin": "yes"}},
    "spreadAcrossNodes": False,
    "networkPolicy": {"enabled": True,
                      "dataFrom": [{"podSelector": {"matchLabels": {"role": "app"}}}],
                      "adminFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}]},
    "nodeSelector": {"kubernetes.io/arch": "amd64"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["gateway"]}]}}]}},
    "config": {
        "providers": {"openai": None, "anthropic": {"api_key": {"env": "ANTHROPIC_API_KEY"}}},
        "models": {"gpt-4o-mini": None, "claude-haiku-4-5": {"provider": "anthropic"}},
        "pools": {"default": {"members": [{"model": "claude-haiku-4-5"}]}},
    },
}
CHART_SECRET_VALUES = {"secret": {"stringData": {
    "BUSBAR_REDIS_URL": "redis://:pw@redis-master:6379/0", "BUSBAR_SIGNING_KEY": "ab" * 32,
    "BUSBAR_ADMIN_TOKEN": "t" * 32, "OPENAI_API_KEY": "sk-test"}}}

RENDERS = {
    "defaults": ({}, "busbar"),
    "other-values": (OTHER_VALUES, "prod"),
    "chart-secret": (CHART_SECRET_VALUES, "gw"),
}


@pytest.fixture(scope="module", params=sorted(RENDERS))
def rendered(request):
    values, release = RENDERS[request.param]
    return render(values=values, release=release, namespace="llm")


@pytest.fixture(scope="module")
def default():
    return render()


@pytest.fixture(scope="module")
def other():
    return render(values=OTHER_VALUES, release="prod")


def pod_spec(r):
    return r.one("Deployment")["spec"]["template"]["spec"]


def container(r):
    (c,) = pod_spec(r)["containers"]
    return c


def config_of(r) -> dict:
    return load_yaml_strict(r.one("ConfigMap")["data"]["config.yaml"])


# ----------------------------------------------------------------------------- schema validation
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_object_validates_strictly(rendered, version):
    kinds = set()
    for source, obj in rendered.objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{source}: {obj['kind']} {obj['metadata']['name']}: {path}: {exc.message}")
        kinds.add(obj["kind"])
    assert {"Deployment", "Service", "ConfigMap"} <= kinds


def test_strict_validation_rejects_an_unknown_field(default):
    # The check above would be empty if strict mode let unknown fields through.
    deployment = copy.deepcopy(default.one("Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_MIN, strict=True)


def test_the_objects_each_default_values_set_renders(default, other):
    assert sorted(o["kind"] for _, o in default.objects) == [
        "ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service",
        "Service", "ServiceAccount"]
    # HPA off, an existing Secret, no ServiceAccount of its own, a NetworkPolicy.
    assert sorted(o["kind"] for _, o in other.objects) == [
        "ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service", "Service"]
    assert "replicas" not in default.one("Deployment")["spec"]          # the HPA owns it
    assert other.one("Deployment")["spec"]["replicas"] == 3
    hpa = default.one("HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "busbar"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 10)
    assert hpa["metrics"][0]["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}


def test_names_and_selectors_hold_together(rendered):
    names = [(o["kind"], o["metadata"]["name"]) for _, o in rendered.objects]
    assert len(names) == len(set(names))
    for kind, name in names:
        assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name), (kind, name)
    deployment = rendered.one("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    for svc in rendered.of_kind("Service"):
        assert svc["spec"]["selector"] == selector
    for pdb in rendered.of_kind("PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"] == selector
        assert pdb["spec"]["minAvailable"] == 1
        # Readiness follows the upstreams: unready pods must not block node drains.
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    for hpa in rendered.of_kind("HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    spec = pod_spec(rendered)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["config"]["configMap"]["name"] == rendered.one("ConfigMap")["metadata"]["name"]
    assert {m["name"] for m in container(rendered)["volumeMounts"]} == set(volumes)
    sa = rendered.of_kind("ServiceAccount")
    if sa:
        assert spec["serviceAccountName"] == sa[0]["metadata"]["name"]
        assert sa[0]["automountServiceAccountToken"] is False


# ----------------------------------------------------------------------------------- security
def test_pod_runs_as_non_root_with_a_read_only_root_filesystem(rendered):
    spec = pod_spec(rendered)
    pod_sc = spec["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    assert pod_sc["runAsUser"] == 65532 and pod_sc["runAsGroup"] == 65532   # the image's USER
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    sc = container(rendered)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc.get("privileged", False) is False


def test_tmp_is_a_writable_volume_for_the_one_file_executable(rendered):
    # The executable unpacks itself into $TMPDIR and runs from there (staticx, then PyInstaller's
    # one-file bootloader): under a read-only root filesystem /tmp must be a volume. An emptyDir
    # is mounted without noexec.
    c = container(rendered)
    env = {e["name"]: e for e in c["env"]}
    assert env["TMPDIR"]["value"] == "/tmp"
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert not mount.get("readOnly")
    (volume,) = [v for v in pod_spec(rendered)["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume
    # Room for at least two unpacked copies (a SIGKILLed one is left behind): 41 MB each, up to
    # 46 MB once a config imports what travels in lazy.pack (docs/operations.md).
    size = volume["emptyDir"]["sizeLimit"]
    assert size.endswith("Mi") and int(size[:-2]) >= 2 * 63
    # Every other mount is read-only.
    assert all(m.get("readOnly") for m in c["volumeMounts"] if m is not mount)


def test_probes(rendered):
    c = container(rendered)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    # Liveness is a TCP connect: a pod whose providers are all down answers /healthz with 503 but
    # is not broken, and restarting it would not help.
    live = c["livenessProbe"]
    assert set(live) & {"httpGet", "tcpSocket", "exec", "grpc"} == {"tcpSocket"}
    assert live["tcpSocket"]["port"] in ports
    assert "tcpSocket" in c["startupProbe"]
    ready = c["readinessProbe"]["httpGet"]
    assert ready["path"] == "/healthz"
    assert ready["port"] == "data" and ports["data"] == 8080
    scheme = "HTTPS" if rendered.one("Deployment")["metadata"]["name"] == "llm-gateway" else "HTTP"
    assert ready["scheme"] == scheme


def test_graceful_shutdown_outlasts_the_drain(default, other):
    # preStop sleep + busbar's drain (limits.drain_timeout_secs, 30 s) fit in the grace period.
    spec = pod_spec(default)
    sleep = container(default)["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert sleep > 0 and spec["terminationGracePeriodSeconds"] >= sleep + 30
    assert "lifecycle" not in container(other)                           # preStopSleepSeconds: 0


def test_data_and_admin_services_are_distinct(rendered):
    services = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s
                for s in rendered.of_kind("Service")}
    assert set(services) == {"data", "admin"}
    data, admin = services["data"], services["admin"]
    assert data["metadata"]["name"] != admin["metadata"]["name"]
    assert admin["metadata"]["name"] == data["metadata"]["name"] + "-admin"
    assert [p["targetPort"] for p in data["spec"]["ports"]] == ["data"]
    assert [p["targetPort"] for p in admin["spec"]["ports"]] == ["admin"]
    ports = {p["name"]: p["containerPort"] for p in container(rendered)["ports"]}
    assert ports == {"data": 8080, "admin": 8081}
    cfg = config_of(rendered)
    assert cfg["listen"] == "0.0.0.0:8080"
    assert cfg["admin_listen"] == "0.0.0.0:8081"


def test_redis_url_and_secrets_come_from_a_secret(rendered):
    c = container(rendered)
    env = {e["name"]: e for e in c["env"]}
    ref = env["BUSBAR_REDIS_URL"]["valueFrom"]["secretKeyRef"]
    assert set(env["BUSBAR_REDIS_URL"]) == {"name", "valueFrom"}
    (from_secret,) = c["envFrom"]
    secret_name = from_secret["secretRef"]["name"]
    assert ref["name"] in (secret_name, "redis-connection")
    cfg = config_of(rendered)
    assert cfg["store"] == {"module": "valkey", "settings": {"url": {"env": "BUSBAR_REDIS_URL"},
                                                             "fail_mode": "closed"}}
    assert cfg["auth"]["signing_key"] == {"env": "BUSBAR_SIGNING_KEY"}
    assert cfg["auth"]["admin_auth"] == ["admin-tokens"]
    assert cfg["identity-providers"] == {"admin-tokens": {
        "module": "admin-tokens", "token": {"env": "BUSBAR_ADMIN_TOKEN"}}}
    # No secret value in the ConfigMap or in the pod spec, whatever the values hold.
    text = rendered.manifest
    for obj in rendered.of_kind("ConfigMap") + rendered.of_kind("Deployment"):
        dumped = yaml.safe_dump(obj)
        assert "redis://" not in dumped and "sk-test" not in dumped
    assert all("value" not in e for e in c["env"] if e["name"].startswith("BUSBAR_") and
               e["name"] not in ("BUSBAR_CONFIG", "BUSBAR_LOG"))
    secrets = rendered.of_kind("Secret")
    if secrets:
        (secret,) = secrets
        assert secret["metadata"]["name"] == secret_name
        assert secret["stringData"]["BUSBAR_REDIS_URL"].startswith("redis://")
        assert "sk-test" in text


def test_secret_is_created_only_from_values_and_never_with_an_existing_one(default, other):
    assert default.of_kind("Secret") == []
    assert container(default)["envFrom"] == [{"secretRef": {"name": "busbar"}}]
    assert other.of_kind("Secret") == []
    assert container(other)["envFrom"] == [{"secretRef": {"name": "gateway-env"}}]
    ref = {e["name"]: e for e in container(other)["env"]}["BUSBAR_REDIS_URL"]["valueFrom"]
    assert ref == {"secretKeyRef": {"name": "redis-connection", "key": "url"}}
    both = render(values={"secret": {"existingSecret": "mine", **CHART_SECRET_VALUES["secret"]}})
    assert both.of_kind("Secret") == []
    created = render(values=CHART_SECRET_VALUES)
    annotations = created.one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/secret" in annotations
    assert "checksum/secret" not in default.one("Deployment")["spec"]["template"]["metadata"]["annotations"]


def test_admin_mtls(default, other):
    cfg = config_of(default)
    assert cfg["admin_require_mtls"] is False and "admin_tls" not in cfg
    cfg = config_of(other)
    assert cfg["admin_require_mtls"] is True
    assert cfg["admin_tls"] == {"cert": {"file": "/etc/busbar/admin-tls/tls.crt"},
                                "key": {"file": "/etc/busbar/admin-tls/tls.key"},
                                "client_ca": {"file": "/etc/busbar/admin-tls/ca.crt"}}
    (mount,) = [m for m in container(other)["volumeMounts"] if m["name"] == "admin-tls"]
    assert mount == {"name": "admin-tls", "mountPath": "/etc/busbar/admin-tls", "readOnly": True}
    (volume,) = [v for v in pod_spec(other)["volumes"] if v["name"] == "admin-tls"]
    assert volume["secret"]["secretName"] == "busbar-admin-tls"
    assert volume["secret"]["defaultMode"] == 0o440       # readable by fsGroup 65532 only
    # `required` in the template: Helm's own error, with the template's position.
    with pytest.raises(helm.HelmReleaseError,
                       match=r"execution error at \(busbar/templates/deployment\.yaml:\d+:\d+\): "
                             r"admin\.mtls\.secretName: the Secret"):
        render(values={"admin": {"mtls": {"enabled": True}}})


def test_network_policy(other):
    policy = other.one("NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    data, admin = policy["ingress"]
    assert data["ports"] == [{"port": "data", "protocol": "TCP"}]
    assert admin["ports"] == [{"port": "admin", "protocol": "TCP"}]
    assert admin["from"] == OTHER_VALUES["networkPolicy"]["adminFrom"]
    # No adminFrom: the admin port is reachable from nowhere (no rule for it).
    closed = render(values={"networkPolicy": {"enabled": True}}).one("NetworkPolicy")["spec"]
    assert [r["ports"][0]["port"] for r in closed["ingress"]] == ["data"]
    assert "from" not in closed["ingress"][0]


# ------------------------------------------------------------------------------------- config
def test_config_is_one_busbar_accepts(rendered):
    """config.yaml through busbar's own loader (`busbar validate --offline`: secret references
    are checked for shape, not resolved): no problem at all."""
    from busbar.config import loader
    from busbar.config.secrets import OfflineEnv

    text = rendered.one("ConfigMap")["data"]["config.yaml"]
    config, out = loader.build(text=text, base_dir="/etc/busbar/conf", env=OfflineEnv({}),
                               offline=True, overlay=False)
    assert out.errors == []
    assert config is not None and config.governance.keys and config.governance.store.kind == "redis"


def test_the_container_runs_the_images_entrypoint_alone(rendered):
    # The Rust gateway's chart contract: `args: []`, so the image's entrypoint (`/busbar`) serves
    # $BUSBAR_CONFIG, which names the config the chart mounts.
    c = container(rendered)
    assert c["args"] == [] and "command" not in c
    env = {e["name"]: e.get("value") for e in c["env"]}
    path = env["BUSBAR_CONFIG"]
    assert path == "/etc/busbar/conf/config.yaml"
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == os.path.dirname(path)]
    (volume,) = [v for v in pod_spec(rendered)["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == rendered.one("ConfigMap")["metadata"]["name"]
    assert os.path.basename(path) in rendered.one("ConfigMap")["data"]


def test_workers_follow_the_cpu_limit(rendered):
    # busbar would start one worker per core of the node; the chart writes the pod's share into
    # the config as advanced.worker_threads (the entrypoint alone takes no --workers), and busbar
    # reads it from there.
    from busbar.config import loader
    from busbar.config.secrets import OfflineEnv

    c = container(rendered)
    workers = config_of(rendered)["advanced"]["worker_threads"]
    cpu = str(c["resources"]["limits"]["cpu"])
    cores = int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    assert workers == max(1, int(cores))
    config, out = loader.build(text=rendered.one("ConfigMap")["data"]["config.yaml"],
                               base_dir="/etc/busbar/conf", env=OfflineEnv({}), offline=True,
                               overlay=False)
    assert out.errors == [] and config.workers == workers


def test_workers_merge_into_the_users_advanced():
    # `workers` joins what config.advanced holds; a worker_threads set there wins; workers 0 or
    # null writes none (busbar's own default then).
    r = render(values={"workers": 2, "config": {"advanced": {
        "response_headers": {"server_timing": True}}}})
    assert config_of(r)["advanced"] == {"worker_threads": 2,
                                        "response_headers": {"server_timing": True}}
    r = render(values={"workers": 2, "config": {"advanced": {"worker_threads": 3}}})
    assert config_of(r)["advanced"] == {"worker_threads": 3}
    for workers in (0, None):
        assert "advanced" not in config_of(render(values={"workers": workers}))


def test_a_config_change_rolls_the_pods(default):
    def checksum(r):
        return r.one("Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert re.fullmatch(r"[0-9a-f]{64}", checksum(default))
    assert checksum(render()) == checksum(default)
    changed = render(values={"config": {"limits": {"drain_timeout_secs": 20}}})
    assert checksum(changed) != checksum(default)
    assert checksum(render(values={"admin": {"mtls": {"enabled": True, "secretName": "t"}}})) \
        != checksum(default)


def test_a_key_in_both_config_and_the_chart_is_refused():
    # `listen` belongs to the chart (ports.data): given in config too, it is a duplicate key, which
    # busbar refuses at boot (and YAML parsing here) instead of silently picking one. Helm does not
    # see it: config.yaml is a string to Helm.
    from busbar.config import loader
    from busbar.config.secrets import OfflineEnv

    r = render(values={"config": {"listen": "0.0.0.0:9999"}})
    with pytest.raises(DuplicateKey, match="duplicate key 'listen'"):
        config_of(r)
    config, out = loader.build(text=r.one("ConfigMap")["data"]["config.yaml"],
                               base_dir="/etc/busbar/conf", env=OfflineEnv({}), offline=True,
                               overlay=False)
    assert config is None and any("duplicate key 'listen'" in e for e in out.errors), out.errors


def test_a_null_value_removes_the_charts_default(default, other):
    # values.yaml's advice for dropping the example provider (config.providers.openai: null):
    # Helm deletes a chart default a user value sets to null.
    assert "openai" in config_of(default)["providers"]
    cfg = config_of(other)
    assert set(cfg["providers"]) == {"anthropic"} and set(cfg["models"]) == {"claude-haiku-4-5"}


@pytest.mark.parametrize("values, error", [
    # A missing map on the way to a value: Go's text/template error.
    ({"admin": None},
     r"at <\.Values\.admin\.mtls\.enabled>:\s+nil pointer evaluating interface \{\}\.mtls"),
    # A value that breaks the YAML the template writes: Helm parses every rendered document.
    ({"service": {"type": "a: [b"}}, r"YAML parse error on busbar/templates/service\.yaml"),
])
def test_helm_refuses_a_bad_value(values, error):
    with pytest.raises(helm.HelmReleaseError, match=error):
        render(values=values)


def test_a_map_for_a_number_renders_and_strict_validation_refuses_it():
    # Helm prints a map as Go does (map[a:1]) where the chart expects a number: the template
    # engine lets it through, the schema check does not.
    r = render(values={"autoscaling": {"enabled": False}, "replicaCount": {"a": 1}})
    deployment = r.one("Deployment")
    assert deployment["spec"]["replicas"] == "map[a:1]"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_MIN, strict=True)


def test_chart_lints_clean():
    # `helm lint --strict`, with the defaults and with everything turned on: nothing above info
    # (the one info: Chart.yaml has no icon).
    for values in ({}, OTHER_VALUES, CHART_SECRET_VALUES):
        report = helm.lint(CHART, values, strict=True)
        assert report["errors"] == [], report
        assert [m for m in report["messages"] if m["severity"] > 1] == [], report


# ---------------------------------------------------------------------- plain manifest, NOTES
def test_plain_manifest_is_the_chart_rendered_with_defaults():
    with open(PLAIN, encoding="utf-8") as fh:
        committed = fh.read()
    assert committed == plain_manifest(), (
        "packaging/k8s/busbar.yaml is out of date: python tests/packaging/test_helm.py --write-plain")
    docs = [d for d in yaml.safe_load_all(committed) if d]
    assert [d["kind"] for d in docs] == [o["kind"] for _, o in render().objects]


def test_notes(default, other):
    assert "http://busbar.default.svc:8080" in default.notes
    assert "create secret generic busbar" in default.notes
    assert "https://llm-gateway-admin.default.svc:8081" in other.notes
    assert "create secret generic" in other.notes         # existingSecret: still to be made
    assert "create secret generic" not in render(values=CHART_SECRET_VALUES).notes


def test_chart_metadata():
    meta = chart().metadata
    assert meta["apiVersion"] == "v2" and meta["name"] == "busbar"
    from busbar import __version__
    assert meta["appVersion"] == __version__
    assert meta["kubeVersion"] == ">=" + KUBE_MIN + "-0"


def test_strict_yaml_refuses_duplicate_keys():
    with pytest.raises(DuplicateKey, match="duplicate key 'a'"):
        load_yaml_strict("a: 1\nb: 2\na: 3\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-plain"]:
        sys.exit(__doc__)
    with open(PLAIN, "w", encoding="utf-8") as fh:
        fh.write(plain_manifest())
    print(f"wrote {os.path.relpath(PLAIN, ROOT)}", file=sys.stderr)
