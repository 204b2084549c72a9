"""CPU-test stand-in (see ../../README.md)."""

from flash_attn import unavailable

all_gather = unavailable("utils.distributed.all_gather")
