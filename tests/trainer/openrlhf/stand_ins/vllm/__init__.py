"""CPU-test stand-in for vLLM (see ../README.md). Not the real package: no engine, no kernels."""

__version__ = "0.29.0"


class SamplingParams:
    """vLLM's sampling parameters, as a plain attribute holder (the fields OpenRLHF sets)."""

    def __init__(self, **kwargs):
        self.temperature = 1.0
        self.top_p = 1.0
        self.top_k = -1
        self.max_tokens = 16
        self.min_tokens = 0
        self.skip_special_tokens = True
        self.logprobs = None
        self.__dict__.update(kwargs)

    def __repr__(self) -> str:
        return f"SamplingParams({self.__dict__})"


def _unavailable(name):
    def call(*args, **kwargs):
        raise RuntimeError(
            f"vllm.{name} is a CPU-test stand-in (tests/trainer/openrlhf/stand_ins); it needs a GPU install")

    return call


AsyncEngineArgs = _unavailable("AsyncEngineArgs")
AsyncLLMEngine = _unavailable("AsyncLLMEngine")
