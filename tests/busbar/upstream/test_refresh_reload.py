"""Credential refreshers follow the config: a reload that removes (or replaces) a provider with a
refreshed credential stops its refresh loop; a provider a reload adds gets one, which the next
reload without it stops again. In-process: a real Gateway, swapped by the control plane's own
swap_in_worker, against a fake Google token endpoint."""
import asyncio

from busbar.config.loader import build
from busbar.admin.live import assign_slots, swap_in_worker
from tests.inproc import InprocGateway
from tests.integration.fakes import Fake, service_account

BASE = """
listen: "127.0.0.1:1"
providers:
  plain: {{protocol: openai, base_url: "http://127.0.0.1:9", api_key: {{env: K}}}}
{vertex}models:
  a: {{provider: plain, upstream_model: a}}
{model}"""
VERTEX = """  vtx: {{protocol: gemini, base_url: "{url}", vertex: {{project: p, location: us-central1}},
         credentials: {{file: sa.json}}, token_url: "{url}/token"}}
"""


def _config(tmp_path, url=None, location="us-central1"):
    vertex = VERTEX.format(url=url).replace("us-central1", location) if url else ""
    model = "  g: {provider: vtx, upstream_model: gemini-2.5-flash}\n" if url else ""
    config, out = build(text=BASE.format(vertex=vertex, model=model), env={"K": "k" * 20},
                        base_dir=str(tmp_path))
    assert config is not None, out.errors
    return config


def test_refreshers_stop_when_their_provider_leaves(tmp_path):
    key = service_account(tmp_path / "sa.json")
    fake = Fake(public_key=key.public_key(), token_lifetime=3600)
    try:
        with_vtx = _config(tmp_path, fake.url)
        without = _config(tmp_path)
        changed = _config(tmp_path, fake.url, "europe-west1")

        with InprocGateway(with_vtx, drain=True) as g:
            gw = g.gw
            # Gateway.start fetched the boot config's first token and keeps refreshing it.
            boot_task = gw.credentials.tasks[0]
            assert not boot_task.done() and gw.snapshot.egress["vtx"].ready

            def swap(cfg, version):
                async def go():
                    await swap_in_worker(gw, cfg, version, assign_slots(gw.snapshot.router, cfg,
                                                                        None))
                    await asyncio.sleep(0)          # let a cancelled task finish
                g.run(go())

            # 1. The provider leaves: the boot refresher's loop is done.
            swap(without, 2)
            assert boot_task.done() and boot_task.cancelled()
            assert gw.credentials.tasks == [] and gw.live_refreshers == []
            # 2. It comes back: a new refresher, started (first token fetched) before the swap.
            swap(with_vtx, 3)
            [r] = gw.live_refreshers
            back = r.tasks[0]
            assert not back.done() and gw.snapshot.egress["vtx"].ready
            # 3. Its config changes: the old Egress's loop stops, the new one's runs.
            swap(changed, 4)
            assert back.cancelled()
            [r] = gw.live_refreshers
            current = r.tasks[0]
            assert not current.done()
            # 4. An unrelated reload keeps it (same Egress, by identity).
            swap(changed, 5)
            assert not current.done() and gw.live_refreshers[0].tasks == [current]
            swap(without, 6)
            assert current.cancelled() and gw.live_refreshers == []
        assert len(fake.find("/token")) >= 3      # boot, the return, the changed provider
    finally:
        fake.close()
