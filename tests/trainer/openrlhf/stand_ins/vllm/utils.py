"""CPU-test stand-in (see ../README.md)."""

import uuid


def random_uuid() -> str:
    return uuid.uuid4().hex
