"""The Helm chart (packaging/helm/busbar) and its plain rendering (packaging/k8s/busbar.yaml),
without a cluster or network: the templates are rendered by tests/packaging/helm_render.py (or by
`helm template` too, when a helm binary is on PATH) and every object is validated against the
Kubernetes API's schemas in strict mode (kubernetes-validate, which ships them). Then the
properties the chart exists for are asserted one by one, so removing one fails here: non-root,
read-only root filesystem with a writable, executable /tmp, probes, the two Services, the Redis URL
from a Secret, a config busbar accepts."""
from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from tests.packaging import helm_render as hr
from tests.packaging.helm_render import TemplateError, render

# The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion; preStop's sleep action is on
# by default from 1.30) and the newest whose schemas kubernetes-validate ships.
KUBE_MIN = "1.30.0"
KUBE_VERSIONS = (KUBE_MIN, kubernetes_validate.utils.latest_version() + ".0")

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
    "tmp": {"medium": "Memory", "sizeLimit": "96Mi"},
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
    return hr.load_yaml_strict(r.one("ConfigMap")["data"]["config.yaml"])


# ----------------------------------------------------------------------------- schema validation
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_object_validates_strictly(rendered, version):
    kinds = set()
    for source, obj, _ in rendered.objects:
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
    assert sorted(o["kind"] for _, o, _ in default.objects) == [
        "ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service",
        "Service", "ServiceAccount"]
    # HPA off, an existing Secret, no ServiceAccount of its own, a NetworkPolicy.
    assert sorted(o["kind"] for _, o, _ in other.objects) == [
        "ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service", "Service"]
    assert "replicas" not in default.one("Deployment")["spec"]          # the HPA owns it
    assert other.one("Deployment")["spec"]["replicas"] == 3
    hpa = default.one("HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "busbar"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 10)
    assert hpa["metrics"][0]["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}


def test_names_and_selectors_hold_together(rendered):
    names = [(o["kind"], o["metadata"]["name"]) for _, o, _ in rendered.objects]
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
    # Room for at least two unpacked copies (32 MB each; a SIGKILLed one is left behind).
    size = volume["emptyDir"]["sizeLimit"]
    assert size.endswith("Mi") and int(size[:-2]) >= 64
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
    assert cfg["store"] == {"kind": "redis", "url": {"env": "BUSBAR_REDIS_URL"}, "fail_mode": "closed"}
    assert cfg["auth"]["signing_key"] == {"env": "BUSBAR_SIGNING_KEY"}
    assert cfg["auth"]["admin_tokens"] == [{"name": "ops", "token": {"env": "BUSBAR_ADMIN_TOKEN"},
                                            "scope": "full"}]
    # No secret value in the ConfigMap or in the pod spec, whatever the values hold.
    text = rendered.manifest()
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
    with pytest.raises(TemplateError, match="admin.mtls.secretName"):
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


def test_workers_follow_the_cpu_limit(rendered):
    # busbar would start one worker per core of the node; the chart passes the pod's share.
    c = container(rendered)
    args = c["args"]
    assert args[:3] == ["serve", "--config", "/etc/busbar/conf/config.yaml"]
    workers = int(args[args.index("--workers") + 1])
    cpu = str(c["resources"]["limits"]["cpu"])
    cores = int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    assert workers == max(1, int(cores))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["BUSBAR_CONFIG"] == args[2]
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {os.path.dirname(args[2])}


def test_a_config_change_rolls_the_pods(default):
    def checksum(r):
        return r.one("Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert re.fullmatch(r"[0-9a-f]{64}", checksum(default))
    assert checksum(render()) == checksum(default)
    changed = render(values={"config": {"limits": {"drain_timeout_secs": 20}}})
    assert checksum(changed) != checksum(default)
    assert checksum(render(values={"admin": {"mtls": {"enabled": True, "secretName": "t"}}})) \
        != checksum(default)


def test_a_key_in_both_config_and_the_chart_is_refused(default):
    # `listen` belongs to the chart (ports.data): given in config too, it is a duplicate key, which
    # YAML parsing here (and busbar at boot) refuses instead of silently picking one.
    r = render(values={"config": {"listen": "0.0.0.0:9999"}})
    with pytest.raises(TemplateError, match="duplicate key 'listen'"):
        config_of(r)


# ---------------------------------------------------------------------- plain manifest, NOTES
def test_plain_manifest_is_the_chart_rendered_with_defaults():
    with open(hr.PLAIN, encoding="utf-8") as fh:
        committed = fh.read()
    assert committed == hr.plain_manifest(), (
        "packaging/k8s/busbar.yaml is out of date: python tests/packaging/helm_render.py --write-plain")
    docs = [d for d in yaml.safe_load_all(committed) if d]
    assert [d["kind"] for d in docs] == [o["kind"] for _, o, _ in render().objects]


def test_notes(default, other):
    assert "http://busbar.default.svc:8080" in default.notes
    assert "create secret generic busbar" in default.notes
    assert "https://llm-gateway-admin.default.svc:8081" in other.notes
    assert "create secret generic" in other.notes         # existingSecret: still to be made
    assert "create secret generic" not in render(values=CHART_SECRET_VALUES).notes


def test_chart_metadata():
    meta = hr.chart_meta(hr.CHART)
    assert meta["APIVersion"] == "v2" and meta["Name"] == "busbar"
    from busbar import __version__
    assert meta["AppVersion"] == __version__
    assert meta["KubeVersion"] == ">=" + KUBE_MIN + "-0"


# --------------------------------------------------------------------------- the renderer itself
def _t(src, values=None, **defines):
    defs = {}
    for name, body in defines.items():
        defs.update(hr.parse(f'{{{{- define "{name}" -}}}}{body}{{{{- end }}}}', name).defines)
    tpl = hr.parse(src, "t")
    root = {"Values": values or {}, "Release": {"Name": "rel"}, "Chart": {"Name": "c"}}
    return hr.Renderer(defs | tpl.defines).render(tpl.body, root)


@pytest.mark.parametrize("src, values, want", [
    ("a {{ .Values.x }} b", {"x": 1}, "a 1 b"),
    ("a\n  {{- .Values.x }}\nb", {"x": "v"}, "av\nb"),
    ("a {{ .Values.x -}}  \n\n b", {"x": "v"}, "a vb"),
    ("{{ .Values.x }}|{{ .Values.y }}|{{ .Values.z }}", {"x": True, "y": 0.5, "z": 1000000}, "true|0.5|1e+06"),
    ("[{{ .Values.missing }}]", {}, "[]"),
    ("{{ .Values.s | quote }}", {"s": 'a"b\\c\n'}, '"a\\"b\\\\c\\n"'),
    ("{{ .Values.n | quote }}", {"n": 8080}, '"8080"'),
    ("{{ .Values.s | default \"d\" }}/{{ .Values.e | default \"d\" }}", {"s": "x", "e": ""}, "x/d"),
    ("{{ if .Values.a }}A{{ else if .Values.b }}B{{ else }}C{{ end }}", {"b": [1]}, "B"),
    ("{{ if and .Values.a (not .Values.b) }}yes{{ end }}", {"a": 1, "b": {}}, "yes"),
    ("{{ or .Values.a .Values.b }}", {"a": "", "b": "z"}, "z"),
    ("{{ printf \"%s-%v\" .Release.Name .Values.p | trunc 6 | trimSuffix \"-\" }}", {"p": 80}, "rel-80"),
    ("x:{{- toYaml .Values.m | nindent 2 }}", {"m": {"b": [1, "on"], "a": "x: y"}},
     "x:\n  a: 'x: y'\n  b:\n  - 1\n  - 'on'"),
    ("{{ include \"n\" . | indent 2 }}", {}, "  c-rel"),
    ("{{/* a comment */}}ok{{- /* trimmed */}}", {}, "ok"),
    ("{{ .Values.s | sha256sum }}", {"s": "abc"},
     "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    ("{{ eq .Values.a \"x\" }} {{ ne .Values.n 2 }}", {"a": "x", "n": 2}, "true false"),
    ("{{ contains \"bus\" .Release.Name }}", {}, "false"),
])
def test_renderer(src, values, want):
    assert _t(src, values, n='{{ .Chart.Name }}-{{ .Release.Name }}') == want


@pytest.mark.parametrize("src, values, error", [
    ("{{ .Values.a.b }}", {}, "nil pointer evaluating interface {}.b"),
    ("{{ .Values.m }}", {"m": {"a": 1}}, "printing a dict"),
    ("{{ upper .Values.s }}", {"s": "x"}, "function 'upper' is not supported"),
    ("{{ range .Values.l }}x{{ end }}", {"l": [1]}, "'range' is not supported"),
    ("{{ if .Values.a }}x", {}, "not closed"),
    ("{{ include \"nope\" . }}", {}, "no template 'nope'"),
    ("{{ required \"need x\" .Values.x }}", {}, "need x"),
    ("{{ printf \"%d\" .Values.n }}", {"n": 1}, "%d is not supported"),
    ("{{ eq .Values.n \"1\" }}", {"n": 1}, "incompatible types"),
    ("{{ .Values.x ", {}, "unclosed action"),
])
def test_renderer_refuses(src, values, error):
    with pytest.raises(TemplateError, match=re.escape(error)):
        _t(src, values)


def test_values_merge_like_helm():
    base = {"a": {"b": 1, "c": {"d": 2}}, "l": [1, 2], "k": "v"}
    assert hr.merge_values(base, {"a": {"c": {"e": 3}, "b": None}, "l": [3]}) == \
        {"a": {"c": {"d": 2, "e": 3}}, "l": [3], "k": "v"}
    assert base == {"a": {"b": 1, "c": {"d": 2}}, "l": [1, 2], "k": "v"}


def test_rendered_yaml_refuses_duplicate_keys():
    with pytest.raises(TemplateError, match="duplicate key 'a'"):
        hr.load_yaml_strict("a: 1\nb: 2\na: 3\n")


# ------------------------------------------------------------------------- against helm itself
@pytest.mark.skipif(shutil.which("helm") is None, reason="no helm binary on PATH (the renderer "
                    "above is what the other tests use)")
@pytest.mark.parametrize("name", sorted(RENDERS))
def test_helm_template_renders_the_same_objects(name, tmp_path):
    values, release = RENDERS[name]
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = subprocess.run(["helm", "template", release, hr.CHART, "-f", str(path),
                          "--namespace", "llm", "--kube-version", KUBE_MIN],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    theirs = sorted((d for d in yaml.safe_load_all(out) if d),
                    key=lambda o: (o["kind"], o["metadata"]["name"]))
    ours = sorted((o for _, o, _ in render(values=values, release=release, namespace="llm").objects),
                  key=lambda o: (o["kind"], o["metadata"]["name"]))
    assert theirs == ours
