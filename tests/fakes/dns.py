"""A stand-in resolver for the outbound guard: CI has no DNS, and tests need names that
resolve to public, private and metadata addresses on purpose.

    use_fake_dns(monkeypatch)   # provider hosts → a public address; the names below → inside
"""

PUBLIC = "93.184.216.34"
INSIDE = {
    "internal.example": "10.0.0.7",
    "metadata.example": "169.254.169.254",
    "localhost": "127.0.0.1",
    "rebound.example": "192.168.1.20",
}


def fake_resolve(host: str, port: int) -> list[str]:
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return [host]
    except ValueError:
        pass
    return [INSIDE.get(host, PUBLIC)]


def use_fake_dns(monkeypatch) -> None:
    monkeypatch.setattr("queue_app.providers.addresses._resolve", fake_resolve)
