"""One way of saying a size, everywhere: units of 1024, "1.5 KB", "20 MB", never "0.0 MB"."""

import pytest

from queue_app.sizes import human_bytes


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (0, "0 bytes"),
        (1, "1 byte"),
        (1023, "1023 bytes"),
        (1536, "1.5 KB"),
        (5000, "4.9 KB"),
        (20 * 1024 * 1024, "20 MB"),
        (25 * 1024 * 1024, "25 MB"),
        (int(1.5 * 1024**3), "1.5 GB"),
        (None, "0 bytes"),
        ("x", "—"),
    ],
)
def test_a_size_reads_as_people_say_it(value, said):
    assert human_bytes(value) == said
