"""The busbar-python SDK (busbar-admin 0.4.0, generated from the Rust gateway's openapi.json)
driving busbar's admin API, config and topology half: every answer parses into the SDK's typed
model (a required field missing or mistyped fails here) with raise_on_unexpected_status on (an
undocumented status fails here), and the parsed model gives back the JSON it was read from."""
import json

import pytest
import yaml

from busbar_admin import AuthenticatedClient
from busbar_admin.api.default import (
    delete_export_name,
    delete_hooks_name,
    delete_overlay_section,
    get_admin_auth,
    get_auth,
    get_config,
    get_config_diff,
    get_config_settings,
    get_config_versions,
    get_config_versions_v,
    get_export,
    get_hooks,
    get_hooks_name,
    get_hooks_name_health,
    get_hooks_name_schema,
    get_hooks_name_status,
    get_identity_providers,
    get_identity_providers_name,
    get_info,
    get_models,
    get_plugins,
    get_pools,
    get_pools_name,
    get_providers,
    patch_hooks_name_settings,
    post_config_apply,
    post_config_reload,
    post_config_rollback,
    post_config_validate,
    post_hooks,
    post_plugins_reload,
    post_restart,
    put_config_settings,
    put_export_name,
)
from busbar_admin.models import (
    DeleteOverlaySectionSection,
    PatchSettingsReq,
    PostConfigApplyBody,
    PostConfigValidateBody,
    PostHooksBody,
    PutConfigSettingsBody,
    PutExportNameBody,
    RestartReq,
    RollbackReq,
)
from tests.conftest import stop
from tests.integration.test_admin import OPS, VIEW
from tests.integration.test_admin_v1 import SIDECAR, start


@pytest.fixture(scope="module")
def gw(mock_port, tmp_path_factory):
    g = start(tmp_path_factory.mktemp("sdk"), mock_port, workers=2)
    yield g
    stop(g.proc)


def client(gw, token=OPS):
    return AuthenticatedClient(base_url="http://127.0.0.1:%d" % gw.admin, token=token,
                               raise_on_unexpected_status=True)


def ok(resp, status=200, model=None):
    """The call answered `status`, its body parsed into `model`, and the model's to_dict() is the
    JSON on the wire (nothing dropped or retyped)."""
    assert resp.status_code == status, resp.content
    if model is not None:
        assert type(resp.parsed).__name__ == model, (type(resp.parsed), resp.content)
        assert resp.parsed.to_dict() == json.loads(resp.content)
    return resp.parsed


def test_the_sdk_reads_the_topology_and_the_config(gw):
    c = client(gw, VIEW)
    info = ok(get_info.sync_detailed(client=c), model="InfoView")
    assert info.build.weighted_floor is True and info.topology.pools == 1
    ok(get_pools.sync_detailed(client=c), model="PagePoolView")
    pools = ok(get_pools.sync_detailed(client=c, detail="true"), model="PagePoolView")
    assert pools.items[0].name == "p" and pools.next_cursor is None
    pool = ok(get_pools_name.sync_detailed("p", client=c), model="PoolDetailView")
    assert pool.members[0].usable is True and pool.members[0].last_trip_at is None
    assert ok(get_pools_name.sync_detailed("zzz", client=c), 404, "Error").error.code == "not_found"
    assert [m.model for m in ok(get_models.sync_detailed(client=c), model="PageModelView").items] == ["a", "b"]
    ok(get_providers.sync_detailed(client=c), model="PageProviderView")
    cfg = ok(get_config.sync_detailed(client=c), model="EffectiveConfigView")
    assert cfg.auth.open_ is True
    ok(get_config_settings.sync_detailed(client=c), model="ConfigSettingsView")
    versions = ok(get_config_versions.sync_detailed(client=c), model="ConfigVersionPageView")
    v0 = ok(get_config_versions_v.sync_detailed(versions.items[-1].version, client=c),
            model="ConfigVersionDetailView")
    assert v0.summary == "boot"
    ok(get_auth.sync_detailed(client=c), model="AuthView")
    assert ok(get_admin_auth.sync_detailed(client=c), model="AdminAuthView").modules == ["ops", "viewer"]
    ok(get_identity_providers.sync_detailed(client=c), model="PageNamedDefView")
    ok(get_identity_providers_name.sync_detailed("viewer", client=c), model="NamedDefView")
    ok(get_export.sync_detailed(client=c), model="PageNamedDefView")
    for t in ("auth", "hooks", "store", "secret"):
        ok(get_plugins.sync_detailed(client=c, type_=t), model="PagePluginView")
    ok(get_plugins.sync_detailed(client=c, type_="nope"), 400, "Error")


def test_the_sdk_changes_the_config(gw):
    c = client(gw)
    doc = yaml.safe_load(gw.path.read_text())
    verdict = ok(post_config_validate.sync_detailed(
        client=c, body=PostConfigValidateBody.from_dict({"config": doc})), model="ConfigValidateView")
    assert verdict.ok is True and verdict.errors == []
    start = ok(get_config.sync_detailed(client=c), model="EffectiveConfigView").version
    applied = ok(post_config_apply.sync_detailed(
        client=c, body=PostConfigApplyBody.from_dict({"config": doc}), if_match='"%d"' % start),
        model="ConfigApplyView")
    assert applied.applied is True and applied.config_version == start + 1
    stale = ok(post_config_apply.sync_detailed(
        client=c, body=PostConfigApplyBody.from_dict({"config": doc}), if_match='"%d"' % start),
        409, "Error")
    assert stale.error.code == "version_conflict"
    ok(post_config_reload.sync_detailed(client=c), model="ConfigReloadView")
    rb = ok(post_config_rollback.sync_detailed(client=c, body=RollbackReq(version=start)),
            model="ConfigRollbackView")
    assert rb.restored_version == start
    hook = ok(post_hooks.sync_detailed(client=c, body=PostHooksBody.from_dict(
        {"name": "sdk1", "config": {"module": "busbar-webrequest-hook", "settings": {"url": SIDECAR},
                                    "kind": "tap", "global": True}})), 201, "HookView")
    assert hook.global_ is True and hook.settings_keys == ["url"]
    ok(get_hooks.sync_detailed(client=c), model="PageHookView")
    ok(get_hooks_name.sync_detailed("sdk1", client=c), model="HookView")
    ok(patch_hooks_name_settings.sync_detailed("sdk1", client=c, body=PatchSettingsReq.from_dict(
        {"settings": {"url": SIDECAR, "timeout_ms": 20}})), model="HookView")
    ok(get_hooks_name_health.sync_detailed("sdk1", client=c), model="HookHealthView")
    ok(get_hooks_name_schema.sync_detailed("sdk1", client=c), model="HookSchemaView")
    ok(get_hooks_name_status.sync_detailed("sdk1", client=c), model="HookStatusView")
    now = ok(get_config.sync_detailed(client=c), model="EffectiveConfigView").version
    diff = ok(get_config_diff.sync_detailed(client=c, from_=start, to=now), model="ConfigDiffView")
    assert diff.hooks.added == ["sdk1"]
    assert ok(delete_hooks_name.sync_detailed("sdk1", client=c), 204) is None
    settings = ok(put_config_settings.sync_detailed(client=c, body=PutConfigSettingsBody.from_dict(
        {"routing": {"default_policy_timeout_ms": 25}})), model="ConfigSettingsView")
    assert settings.applied is True and settings.reload_to_apply == []
    reset = ok(delete_overlay_section.sync_detailed(DeleteOverlaySectionSection.ROOT, client=c),
               model="OverlayResetView")
    assert reset.changed is True
    exp = ok(put_export_name.sync_detailed("sdkx", client=c, body=PutExportNameBody.from_dict(
        {"module": "request-log-file", "settings": {"path": str(gw.path.parent / "r.log")}})),
        model="NamedDefView")
    assert exp.settings_keys == ["path"]
    assert ok(delete_export_name.sync_detailed("sdkx", client=c), 204) is None
    ok(post_plugins_reload.sync_detailed(client=c), model="PluginReloadView")
    refused = ok(post_restart.sync_detailed(client=c, body=RestartReq(confirm=False)), 409, "Error")
    assert refused.error.code == "conflict"
