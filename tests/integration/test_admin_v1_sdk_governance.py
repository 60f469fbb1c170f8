"""The busbar-python SDK (busbar-admin 0.4.0, generated from the Rust gateway's openapi.json)
driving busbar's admin API, governance half: keys, groups, usage, audit, the signing-key report and
the cache flush. raise_on_unexpected_status is on (an undocumented status fails here), every answer
parses into the SDK's typed model (a required field missing or mistyped fails here), and the model
gives back exactly the JSON on the wire (nothing dropped, renamed or retyped)."""
import json

import pytest

from busbar_admin import AuthenticatedClient
from busbar_admin.api.default import (
    delete_groups_name,
    delete_keys_id,
    get_audit,
    get_groups,
    get_groups_name,
    get_groups_name_usage,
    get_keys,
    get_keys_id,
    get_keys_id_usage,
    get_usage,
    patch_groups_name,
    patch_keys_id,
    post_auth_cache_flush,
    post_groups,
    post_keys,
    post_keys_id_revoke,
    post_keys_id_rotate,
    post_signing_key_rotate,
    put_groups_name,
)
from busbar_admin.models import (
    CreateKeyReq,
    FlushCacheReq,
    PatchGroupsNameBody,
    PostGroupsBody,
    PutGroupsNameBody,
    UpdateKeyReq,
)
from tests.conftest import start_gateway, stop
from tests.integration.gov_helpers import ADMIN, gov_config, gov_env, post
from tests.integration.test_admin_v1_governance import GROUPS


@pytest.fixture(scope="module")
def gw(mock_port, tmp_path_factory):
    text, admin = gov_config(mock_port, GROUPS)
    g = start_gateway(tmp_path_factory.mktemp("sdkgov"), text, 2, gov_env())
    g.admin = admin
    yield g
    stop(g.proc)


def client(gw):
    # as the SDK's README configures it: the token in x-admin-token, no Bearer prefix
    return AuthenticatedClient(base_url="http://127.0.0.1:%d" % gw.admin, token=ADMIN,
                               auth_header_name="x-admin-token", prefix="",
                               raise_on_unexpected_status=True)


def ok(resp, status=200, model=None):
    assert resp.status_code == status, resp.content
    if model is not None:
        assert type(resp.parsed).__name__ == model, (type(resp.parsed), resp.content)
        assert resp.parsed.to_dict() == json.loads(resp.content)
    return resp.parsed


def test_the_sdk_manages_keys(gw):
    c = client(gw)
    k = ok(post_keys.sync_detailed(client=c, body=CreateKeyReq.from_dict(
        {"name": "sdk", "group": "team", "labels": {"team": "growth"}, "expires_in": "7d",
         "issue_aws_credential": True})), 201, "CreatedKeyView")
    assert k.state == "active" and k.token.startswith("bbk_") and k.group_provisioned is False
    body = {"model": "oai-model", "messages": [{"role": "user", "content": "hi"}]}
    assert post(gw, "/v1/chat/completions", body, {"authorization": "Bearer " + k.token})[0] == 200
    page = ok(get_keys.sync_detailed(client=c, limit="1"), model="KeyPageView")
    assert len(page.items) == 1
    ok(get_keys.sync_detailed(client=c, group="team", enabled="true"), model="KeyPageView")
    assert ok(get_keys.sync_detailed(client=c, enabled="maybe"), 400, "Error").error.code == \
        "invalid_request"
    resp = get_keys_id.sync_detailed(k.id, client=c)
    view = ok(resp, model="KeyView")
    tag = resp.headers["etag"]
    assert view.labels.to_dict() == {"team": "growth"}
    patched = ok(patch_keys_id.sync_detailed(k.id, client=c, body=UpdateKeyReq(enabled=False),
                                             if_match=tag), model="KeyView")
    assert patched.state == "disabled"
    stale = ok(patch_keys_id.sync_detailed(k.id, client=c, body=UpdateKeyReq(enabled=True),
                                           if_match=tag), 409, "Error")
    assert stale.error.code == "version_conflict"
    ok(patch_keys_id.sync_detailed(k.id, client=c, body=UpdateKeyReq(enabled=True)),
       model="KeyView")
    rotated = ok(post_keys_id_rotate.sync_detailed(k.id, client=c), model="RotatedKeyView")
    assert rotated.token != k.token and rotated.id == k.id
    usage = ok(get_keys_id_usage.sync_detailed(k.id, client=c), model="KeyMeteringView")
    assert usage.budget_period == "total"
    assert ok(post_keys_id_revoke.sync_detailed(k.id, client=c), model="RevokeView").revoked == k.id
    tag = get_keys_id.sync_detailed(k.id, client=c).headers["etag"]
    assert ok(delete_keys_id.sync_detailed(k.id, client=c, if_match=tag), 204) is None
    assert ok(get_keys_id.sync_detailed(k.id, client=c), model="KeyView").state == "tombstoned"
    assert ok(get_keys_id.sync_detailed("vk_nope", client=c), 404, "Error").error.code == \
        "not_found"


def test_the_sdk_manages_groups_and_reads_usage_and_audit(gw):
    c = client(gw)
    resp = get_groups.sync_detailed(client=c)
    ok(resp, model="PageGroupView")
    g = ok(post_groups.sync_detailed(client=c, body=PostGroupsBody.from_dict(
        {"name": "sdk-team", "config": {"parent": "team", "limits": [{"budget": 500, "per": "month"}],
                                        "child_default": {"limits": [{"requests": 5, "per": "minute"}]}}}),
        if_match=resp.headers["etag"]), 201, "GroupView")
    assert g.limits[0].metric == "budget" and g.child_default[0].amount == 5
    resp = get_groups_name.sync_detailed("sdk-team", client=c)
    ok(resp, model="GroupView")
    g = ok(patch_groups_name.sync_detailed("sdk-team", client=c, body=PatchGroupsNameBody.from_dict(
        {"enabled": False}), if_match=resp.headers["etag"]), model="GroupView")
    assert g.enabled is False
    g = ok(put_groups_name.sync_detailed("sdk-team", client=c, body=PutGroupsNameBody.from_dict(
        {"config": {"parent": "team"}})), model="GroupView")
    assert g.limits == []
    ok(get_groups_name_usage.sync_detailed("team", client=c), model="GroupUsageView")
    assert ok(delete_groups_name.sync_detailed("team", client=c), 409, "Error").error.code == \
        "conflict"
    assert ok(delete_groups_name.sync_detailed("sdk-team", client=c), 204) is None
    usage = ok(get_usage.sync_detailed(client=c), model="UsageView")
    assert usage.currency == "USD"
    assert ok(get_usage.sync_detailed(client=c, window="1"), 400, "Error").error.code == \
        "invalid_request"
    audit = ok(get_audit.sync_detailed(client=c, resource="group:sdk-team"), model="AuditPageView")
    assert [e.action for e in audit.items] == ["group.delete", "group.replace", "group.patch",
                                               "group.create"]
    ok(get_audit.sync_detailed(client=c, limit="2"), model="AuditPageView")
    report = ok(post_signing_key_rotate.sync_detailed(client=c), model="SigningKeyRotateView")
    assert report.revoke_all is True
    ok(post_auth_cache_flush.sync_detailed(client=c, body=FlushCacheReq()), model="CacheFlushView")
