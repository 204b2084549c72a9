"""CPU-test stand-in for flash-attn (see ../README.md). Not the real package."""

__version__ = "0.0.0+stand-in"


def unavailable(name: str):
    def call(*args, **kwargs):
        raise RuntimeError(
            f"flash_attn.{name} is a CPU-test stand-in (tests/trainer/openrlhf/stand_ins); it needs a GPU install")

    call.__name__ = name.rsplit(".", 1)[-1]
    return call
