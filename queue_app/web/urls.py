from django.urls import path

from queue_app.web import api, attention, cancel, mcp, monitor, pages

urlpatterns = [
    # pages
    path("projects/", pages.project_list, name="project_list"),
    path("projects/<int:project_id>/", pages.project_detail, name="project_detail"),
    path("projects/<int:project_id>/start", pages.project_start, name="project_start"),
    path("projects/<int:project_id>/retry", pages.project_retry, name="project_retry"),
    path("projects/<int:project_id>/drafts", pages.project_drafts, name="project_drafts"),
    path("projects/<int:project_id>/drafts/delete", pages.project_delete_drafts, name="project_delete_drafts"),
    path("projects/<int:project_id>/cancel", cancel.project_cancel, name="project_cancel"),
    path("jobs/<uuid:job_id>/", pages.job_detail, name="job_detail"),
    path("jobs/<uuid:job_id>/cancel", cancel.job_cancel, name="job_cancel"),
    path("providers/", pages.provider_list, name="provider_list"),
    path("providers/new", pages.provider_edit, name="provider_new"),
    path("providers/<int:provider_id>/", pages.provider_edit, name="provider_edit"),
    path("album/<int:item_id>/file", pages.album_file, name="album_file"),
    path("album/<int:item_id>/poster", pages.album_file, {"variant": "poster"}, name="album_poster"),
    path("account/", pages.account, name="account"),
    path("account/tokens", pages.account_token_create, name="account_token_create"),
    path("account/tokens/<int:token_id>/revoke", pages.account_token_revoke, name="account_token_revoke"),
    # Queue Monitor
    path("queue/", monitor.monitor, name="queue_monitor"),
    path("queue/providers/<int:provider_id>/<str:action>", monitor.provider_action, name="monitor_provider_action"),
    path("queue/failed/<str:action>", monitor.failed_action, name="monitor_failed_action"),
    path("queue/cancel", cancel.monitor_cancel, name="monitor_cancel"),
    path("queue/attention/<str:action>", attention.attention_action, name="monitor_attention_action"),
    # JSON API (documented in the README)
    path("api/queue/status", api.queue_status_view, name="api_queue_status"),
    path("api/queue/clear-failed", api.clear_failed_view, name="api_clear_failed"),
    path("api/queue/retry-failed", api.retry_failed_view, name="api_retry_failed"),
    path("api/projects/<int:project_id>/drafts", api.drafts_view, name="api_drafts"),
    path("api/projects/<int:project_id>/start", api.start_view, name="api_start"),
    path("api/projects/<int:project_id>/jobs", api.project_jobs_view, name="api_project_jobs"),
    path("api/jobs/retry", api.jobs_retry_view, name="api_jobs_retry"),
    path("api/jobs/cancel", api.jobs_cancel_view, name="api_jobs_cancel"),
    path("api/providers/<int:provider_id>", api.provider_view, name="api_provider"),
    # MCP (Streamable HTTP, JSON-RPC 2.0)
    path("mcp", mcp.mcp_view, name="mcp"),
]
