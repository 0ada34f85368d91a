"""The edge's bounds where daphne reads a request, and its access log without query strings.

Daphne (Twisted) reads a whole body before the application runs, parses a form POST in
memory and queues all of it at once: a 200 MB POST cost hundreds of MB, whatever the
application answered. `GuardedRequest` changes three things:

- a Content-Length over the route's bound (edge.limit_for) is answered 413 at once and
  nothing of the body is kept; a body that streams past it is cut off the same way;
- Twisted's in-memory form parsing is off;
- the body stays in Twisted's file (on disk past 100 KB), handed to the ASGI edge
  (edge.BodyLimit), which reads it in 64 KB pieces.

The access log daphne writes names each request's path without its query: search words
are prompts (the monitor's and album's `q=`), and logs carry no prompts.
"""

import io

from daphne import cli, server
from daphne.access import AccessLogGenerator
from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.internet import reactor

from remixstudio import edge

LINGER_SECONDS = 5  # a refused body is read and dropped this long, so the client sees the 413
LAZY_BYTES = 64 * 1024  # smaller bodies go on daphne's queue as they always did


class _Hidden:
    """The body file as daphne's read loop sees it: empty. The edge reads the real one."""

    def __init__(self, file):
        self.file = file

    def read(self, *args):
        return b""

    def seek(self, *args):
        return self.file.seek(*args)

    def tell(self):
        return self.file.tell()

    @property
    def closed(self):
        return self.file.closed

    def close(self):
        self.file.close()


class GuardedRequest(WebRequest):
    _refused = False
    _received = 0
    _limit = None
    _body_file = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._parsePOSTFormSubmission = False  # Twisted's own parse would read it all into memory

    def gotLength(self, length):
        path = getattr(self.channel, "_path", b"/").split(b"?", 1)[0].decode("ascii", "replace")
        self._path_seen = path
        self._limit = edge.limit_for(path)
        if length is not None and length > self._limit:
            self._refuse(length)
            return
        super().gotLength(length)

    def handleContentChunk(self, data):
        if self._refused:
            return  # dropped while the 413 is on its way
        self._received += len(data)
        if self._received > self._limit:
            self._refuse(None)
            return
        super().handleContentChunk(data)

    def requestReceived(self, command, path, version):
        if self._refused:
            self._close()
            return
        super().requestReceived(command, path, version)

    def process(self):
        if self.content is not None:
            size = self.content.seek(0, io.SEEK_END)
            self.content.seek(0)
            if size > LAZY_BYTES:
                self._body_file, self.content = self.content, _Hidden(self.content)
        return super().process()

    @property
    def application_queue(self):
        return self.__dict__.get("_application_queue")

    @application_queue.setter
    def application_queue(self, queue):
        self.__dict__["_application_queue"] = _Handover(queue, self) if queue is not None else None

    def _refuse(self, declared):
        self._refused = True
        self.requestHeaders.removeHeader(b"Expect")  # no "100 Continue" for a body we refuse
        content_type, body = edge.refusal(self._path_seen, self._limit, declared)
        head = f"HTTP/1.1 413 Content Too Large\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
        self.channel.transport.write(head.encode() + b"Content-Type: " + content_type + b"\r\n\r\n" + body)
        reactor.callLater(LINGER_SECONDS, self._close)

    def _close(self):
        if self.channel is not None and self.channel.transport is not None:
            self.channel.transport.loseConnection()


class _Handover:
    """Daphne's application queue, with its one body message naming the body's file."""

    def __init__(self, queue, request: GuardedRequest):
        self.queue, self.request = queue, request

    def put_nowait(self, message):
        if message.get("type") == "http.request" and self.request._body_file is not None:
            message = {"type": "http.request", "body": b"", "more_body": True, edge.BODY_FILE: self.request._body_file}
        self.queue.put_nowait(message)

    def __getattr__(self, name):
        return getattr(self.queue, name)


class GuardedHTTPFactory(HTTPFactory):
    def buildProtocol(self, addr):
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = GuardedRequest
        return protocol


class QuietAccessLog(AccessLogGenerator):
    """Daphne's access log, each path without its query string."""

    def __call__(self, protocol, action, details):
        if "path" in details:
            details = {**details, "path": str(details["path"]).split("?", 1)[0]}
        super().__call__(protocol, action, details)


def install() -> None:
    """Daphne builds its server after importing the application: from then on it uses
    these (daphne names them as module globals; there is no setting for either)."""
    server.HTTPFactory = GuardedHTTPFactory
    cli.AccessLogGenerator = QuietAccessLog
