"""CPU-test stand-in (see ../../README.md)."""
