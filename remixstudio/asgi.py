import os
import sys

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "remixstudio.settings")
# Django must be set up before the consumers are imported.
django_asgi_app = get_asgi_application()

# Static files are served by WhiteNoise's middleware (settings.MIDDLEWARE), in every mode.

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from queue_app.web.live.routing import websocket_urlpatterns  # noqa: E402
from remixstudio import edge  # noqa: E402

# The edge first: every request body and WebSocket message is bounded before it is read.
application = edge.BodyLimit(
    ProtocolTypeRouter(
        {
            "http": django_asgi_app,
            "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        }
    )
)

if "daphne.server" in sys.modules:
    # daphne is serving: its request reading keeps the same bounds, its access log no queries
    from remixstudio import daphne_edge  # noqa: E402

    daphne_edge.install()


def serving() -> bool:
    """This process is the web server (daphne, as run_stack and the README start it), not a
    test or a management command importing the application. WEB_HEARTBEAT=1 names another
    ASGI server as serving; WEB_HEARTBEAT=0 turns the beat off."""
    forced = os.getenv("WEB_HEARTBEAT", "")
    if forced in ("0", "1"):
        return forced == "1"
    return "daphne" in os.path.basename(os.path.dirname(sys.argv[0]) if sys.argv[0].endswith("__main__.py") else sys.argv[0])


if serving():
    # the workers page lists every live process, web ones too
    from queue_app.engine import heartbeats  # noqa: E402

    heartbeats.start_process_heartbeat("web")
