"""CPU-test stand-in (see ../README.md)."""


class TokensPrompt(dict):
    pass
