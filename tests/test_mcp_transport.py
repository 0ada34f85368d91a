"""The /mcp transport against the specification (2025-06-18, and 2025-11-25 offered):
JSON-RPC errors for every failure, never an HTML or text page (issue 17)."""

import json

import pytest
from django.test import Client

from queue_app import limits
from queue_app.web import mcp, tokens

pytestmark = pytest.mark.django_db


@pytest.fixture
def raw_token(owner):
    return tokens.token_create(user=owner, name="transport")[1]


@pytest.fixture
def client(raw_token):
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw_token}", raise_request_exception=False)


def send(client, message, **headers):
    data = message if isinstance(message, str | bytes) else json.dumps(message)
    return client.post("/mcp", data=data, content_type="application/json", **headers)


def request(method, params=None, id_=1):
    return {"jsonrpc": "2.0", "id": id_, "method": method, **({"params": params} if params is not None else {})}


def assert_json_rpc_error(response, status, code):
    assert response.status_code == status, response.content[:200]
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == code
    return response.json()["error"]["message"]


@pytest.mark.parametrize("params", [[], "x", 3, True])
@pytest.mark.parametrize("method", ["initialize", "tools/call", "tools/list"])
def test_non_object_params_answer_a_json_rpc_invalid_params_error(client, method, params):
    assert_json_rpc_error(send(client, request(method, params)), 200, mcp.INVALID_PARAMS)


@pytest.mark.parametrize("arguments", [[], "x", 1])
def test_non_object_tool_arguments_answer_invalid_params(client, arguments):
    response = send(client, request("tools/call", {"name": "list_projects", "arguments": arguments}))
    assert "arguments" in assert_json_rpc_error(response, 200, mcp.INVALID_PARAMS)


def test_unknown_tool_and_unknown_method_are_json_rpc_errors(client):
    assert_json_rpc_error(send(client, request("tools/call", {"name": "no_such_tool"})), 200, mcp.INVALID_PARAMS)
    assert_json_rpc_error(send(client, request("resources/nothing")), 200, mcp.METHOD_NOT_FOUND)


def test_an_oversized_message_is_a_json_rpc_error_not_a_text_page(client):
    big = json.dumps(request("ping", {"pad": "x" * (limits.REQUEST_BYTES + 10)}))
    assert_json_rpc_error(send(client, big), 413, mcp.INVALID_REQUEST)


@pytest.mark.parametrize("raw", ["{not json", '{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"a": NaN}}', b"\xff"])
def test_unparseable_messages_are_json_rpc_parse_errors(client, raw):
    assert_json_rpc_error(send(client, raw), 400, mcp.PARSE_ERROR)


def test_a_foreign_origin_is_refused_and_this_host_or_a_configured_origin_is_not(client, settings):
    assert_json_rpc_error(send(client, request("ping"), HTTP_ORIGIN="https://evil.example"), 403, mcp.INVALID_REQUEST)
    assert_json_rpc_error(send(client, request("ping"), HTTP_ORIGIN="null"), 403, mcp.INVALID_REQUEST)
    assert send(client, request("ping"), HTTP_ORIGIN="http://testserver").status_code == 200
    settings.MCP_ALLOWED_ORIGINS = ["https://inspector.example"]
    assert send(client, request("ping"), HTTP_ORIGIN="https://inspector.example").status_code == 200
    assert send(client, request("ping")).status_code == 200  # no Origin: not a browser


def test_an_unsupported_protocol_version_header_answers_400(client):
    response = send(client, request("ping"), HTTP_MCP_PROTOCOL_VERSION="1999-01-01")
    assert "MCP-Protocol-Version" in assert_json_rpc_error(response, 400, mcp.INVALID_REQUEST)
    for version in ("2025-11-25", "2025-06-18", "2025-03-26"):
        assert send(client, request("ping"), HTTP_MCP_PROTOCOL_VERSION=version).status_code == 200


def test_initialize_offers_2025_11_25_and_answers_an_unknown_version_with_the_latest(client):
    asked = {"capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    assert send(client, request("initialize", {**asked, "protocolVersion": "2025-11-25"})).json()["result"][
        "protocolVersion"
    ] == ("2025-11-25")
    assert send(client, request("initialize", {**asked, "protocolVersion": "2025-06-18"})).json()["result"][
        "protocolVersion"
    ] == ("2025-06-18")
    fallback = send(client, request("initialize", {**asked, "protocolVersion": "2099-01-01"})).json()["result"]
    assert fallback["protocolVersion"] == mcp.PROTOCOL_VERSIONS[0] == "2025-11-25"


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 7, "result": {}},
        {"jsonrpc": "2.0", "id": "x", "error": {"code": -1, "message": "no"}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        [{"jsonrpc": "2.0", "id": 7, "result": {}}, {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}],
    ],
)
def test_posted_responses_and_notifications_are_accepted_with_202_and_no_body(client, message):
    response = send(client, message)
    assert response.status_code == 202 and response.content == b""
    assert "text/html" not in response.get("Content-Type", "")


def test_a_response_is_not_answered_as_if_it_were_a_request(client):
    # a response that happens to carry a "method"-less body must never run anything
    response = send(client, {"jsonrpc": "2.0", "id": 1, "result": {"name": "clear_failed_jobs"}})
    assert response.status_code == 202


def test_an_empty_batch_is_an_error(client):
    assert_json_rpc_error(send(client, []), 400, mcp.INVALID_REQUEST)


def test_a_batch_answers_each_request_in_a_list(client):
    replies = send(
        client, [request("ping", id_=1), {"jsonrpc": "2.0", "method": "notifications/x"}, request("nope", id_=2)]
    ).json()
    assert [reply["id"] for reply in replies] == [1, 2]
    assert replies[0]["result"] == {} and replies[1]["error"]["code"] == mcp.METHOD_NOT_FOUND


@pytest.mark.parametrize("method", ["get", "delete", "put"])
def test_other_http_methods_answer_405_in_json(client, method):
    response = getattr(client, method)("/mcp")
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert response["Content-Type"] == "application/json" and response.json()["error"]["message"]


def test_401_points_at_the_protected_resource_metadata(owner):
    anonymous = Client()
    response = send(anonymous, request("ping"))
    assert response.status_code == 401 and response["Content-Type"] == "application/json"
    header = response["WWW-Authenticate"]
    assert header.startswith("Bearer ") and 'resource_metadata="http://testserver/.well-known/oauth-protected-resource"' in header
    metadata = anonymous.get("/.well-known/oauth-protected-resource")
    assert metadata.status_code == 200 and metadata["Content-Type"] == "application/json"
    body = metadata.json()
    assert body["resource"] == "http://testserver/mcp" and body["bearer_methods_supported"] == ["header"]
    assert send(Client(HTTP_AUTHORIZATION="Bearer rsq_wrong"), request("ping")).status_code == 401


def test_a_tool_that_breaks_is_a_json_rpc_internal_error_not_a_500(client, monkeypatch):
    from queue_app.web import mcp_tools

    monkeypatch.setitem(
        mcp_tools.BY_NAME,
        "list_projects",
        mcp_tools.BY_NAME["list_projects"].__class__(
            **{**mcp_tools.BY_NAME["list_projects"].__dict__, "run": lambda ctx, args: 1 / 0}
        ),
    )
    response = send(client, request("tools/call", {"name": "list_projects"}))
    assert response.json()["error"] == {"code": mcp.INTERNAL_ERROR, "message": "internal error"}
