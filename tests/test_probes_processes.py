"""The probes of a real daphne: /readyz follows this web process's own dependencies, not
the fleet's, and /livez needs nothing at all."""

import pytest
import requests

from tests import procs

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def probe(web, path: str) -> tuple[int, dict]:
    response = requests.get(f"{web.url}{path}", timeout=15)
    return response.status_code, response.json()


def test_readyz_stays_200_on_a_web_whose_workers_are_stopped(tmp_path):
    logs = tmp_path / "logs"
    web = procs.daphne(logs)
    cluster, service = procs.qcluster(logs, workers=1), procs.queue_service(logs)
    try:
        procs.wait_for(lambda: probe(web, "/fleetz")[0] == 200, timeout=60, message="the fleet alive")
        assert probe(web, "/readyz")[0] == 200
        cluster.stop()
        service.stop()
        # stopped cleanly, both leave the live set: the fleet is down, the web still serves
        procs.wait_for(lambda: probe(web, "/fleetz")[0] == 503, timeout=60, message="the fleet reported down")
        status, body = probe(web, "/readyz")
        assert status == 200 and body["ok"] is True and body["checks"]["database"] == "ok"
        assert probe(web, "/livez")[0] == 200
    finally:
        for proc in (cluster, service, web):
            proc.stop()


def test_readyz_is_503_on_a_web_whose_database_is_unreachable(tmp_path):
    port = procs.free_port()  # nothing listens there
    web = procs.daphne(tmp_path / "logs", DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/gone", REDIS_URL="")
    try:
        status, body = probe(web, "/readyz")
        assert status == 503 and body == {"ok": False, "checks": {"database": "down"}}
        assert probe(web, "/livez") == (200, {"ok": True, "checks": {"process": "ok"}})
    finally:
        web.stop()


def test_readyz_is_503_on_a_web_whose_redis_is_wrong(tmp_path):
    port = procs.free_port()
    web = procs.daphne(tmp_path / "logs", REDIS_URL=f"redis://127.0.0.1:{port}/0")
    try:
        status, body = probe(web, "/readyz")
        assert status == 503 and body == {"ok": False, "checks": {"database": "ok", "redis": "down"}}
        assert probe(web, "/livez")[0] == 200
    finally:
        web.stop()
