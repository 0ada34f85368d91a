"""Write services: everything pages, the API, admin, MCP and commands change goes through
one of these modules (`<entity>_<action>`, keyword-only arguments). Callers import from the
module itself (`from queue_app.services.jobs import jobs_start`).
"""
