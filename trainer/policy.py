"""Policies for the local trainer: load a transformers causal LM, or build a seeded tiny Qwen3.

`load_policy("PATH")` loads any local causal LM whose tokenizer has a chat template (Qwen2.5, Qwen3).
`load_policy("tiny")` builds a randomly initialised small Qwen3 (seeded) on

- the real Qwen3 tokenizer, from `tokenizer=PATH` (default `../shared/data/tokenizers/qwen3` when it
  exists): its 151,669-token vocabulary makes the embedding and the softmax dominate the cost;
- or, with `tokenizer="trained"` (or when no Qwen3 tokenizer is found), a byte-level BPE trained on
  the fly with the `tokenizers` library on text from the env (`corpus`), with a ChatML template: a
  vocabulary of a few thousand tokens keeps a CPU run fast.

Devices: CPU by default; CUDA in bf16 when a GPU is present (`device="auto"`). torch and transformers load
when a function needs them, so that the CLI can check an `hf:` agent and pin its threads without them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.models import NAMED_MODELS, NamedModelError, resolve_model

if TYPE_CHECKING:
    import torch

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_QWEN3_TOKENIZER",
    "TINY_MODEL_PARAMETERS",
    "PolicyLoadError",
    "TinyModelSpec",
    "own_aligned_storage",
    "resolve_autocast",
    "build_tiny_model",
    "end_of_turn_ids",
    "load_hf_policy",
    "load_policy",
    "load_tokenizer",
    "parameter_count",
    "pin_cpu_threads",
    "cpu_bf16_unsupported",
    "cpu_has_fast_bf16",
    "autocast_context",
    "resolve_device",
    "resolve_dtype",
    "train_tokenizer",
]

# The shared data folder beside the repository (a checkout's `../shared`), whatever the working folder.
DEFAULT_QWEN3_TOKENIZER = Path(__file__).resolve().parents[2] / "shared" / "data" / "tokenizers" / "qwen3"

# ChatML, as Qwen2.5 writes it (no reasoning stripping): system/user/assistant turns between
# <|im_start|>ROLE\n and <|im_end|>\n; the generation prompt opens an assistant turn.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class PolicyLoadError(ValueError):
    """A policy or tokenizer cannot be loaded; the message says how to fix it."""


# Below this many parameters a model's matrix products are so small that OpenMP synchronisation
# dominates a CPU forward pass: one torch thread is faster (the trainer pins one for the same reason).
TINY_MODEL_PARAMETERS = 50_000_000


def pin_cpu_threads(model, threads: int | None = None) -> int:
    """Set torch's CPU thread count for `model` when it runs on the CPU; returns the count in force.

    Args:
        threads: a count; 0 leaves torch's setting as it is; None (auto): 1 for a model under
            `TINY_MODEL_PARAMETERS` (the trainer's tiny models: one thread is faster than torch's
            default there, docs/trainer-performance.md), torch's setting otherwise.
    """
    import torch

    if threads is not None and int(threads) < 0:
        raise PolicyLoadError(f"cpu_threads must be >= 0, got {threads}")
    if next(model.parameters()).device.type != "cpu":
        return torch.get_num_threads()
    if threads is None:
        threads = 1 if sum(p.numel() for p in model.parameters()) < TINY_MODEL_PARAMETERS else 0
    if int(threads) > 0:
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


def resolve_device(name: str = "auto"):
    """`auto` is CUDA when a GPU is present, else CPU; `cpu`, `cuda`, `cuda:N` as given."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PolicyLoadError(f"device {name!r}: no CUDA GPU is visible here; use device cpu")
    return device


def resolve_dtype(name: str, device):
    """`auto` is bf16 on CUDA and float32 on CPU; `float32`, `bfloat16`, `float16` as given."""
    import torch

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise PolicyLoadError(f"dtype {name!r}: use auto, float32, bfloat16 or float16")
    return table[name]


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """This CPU's feature flags from /proc/cpuinfo (empty where there is none), read once: every
    `autocast_context` asks."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _torch_cpu_kernels() -> str:
    """The instruction set torch's CPU kernels were dispatched to: AVX512, AVX2, DEFAULT (capped by the
    ATEN_CPU_CAPABILITY environment variable), or another architecture's name."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (Intel AMX-BF16, AVX512-BF16) and torch
    runs its AVX-512 kernels, which use those units: there bf16 autocast about doubles a CPU forward's
    tokens/s; elsewhere bf16 is emulated and slower."""
    return bool(_cpu_flags() & {"amx_bf16", "avx512_bf16"}) and _torch_cpu_kernels() == "AVX512"


def cpu_bf16_unsupported() -> str | None:
    """Why bf16 cannot run on this CPU in this process, or None. torch's bf16 attention packs its blocks
    for AMX whenever the CPU has AMX, with a routine that exists only in its AVX-512 kernels: on an AMX
    CPU whose kernels are capped below AVX-512 (ATEN_CPU_CAPABILITY), every bf16 attention fails."""
    kernels = _torch_cpu_kernels()
    if "amx_bf16" in _cpu_flags() and kernels in ("DEFAULT", "AVX2"):
        return (f"this CPU has AMX but torch runs its {kernels} kernels "
                f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'unset')}), and its bf16 attention "
                "then fails; unset ATEN_CPU_CAPABILITY, or use --autocast none")
    return None


def resolve_autocast(name: str, device) -> str:
    """`bf16` or `none`: what an `--autocast` setting means on `device` (`auto`: bf16 on a CPU with
    native bf16 units, none otherwise; on CUDA the weights are already bf16 by `resolve_dtype`)."""
    import torch

    device = torch.device(device) if not isinstance(device, torch.device) else device
    if name == "auto":
        return "bf16" if device.type == "cpu" and cpu_has_fast_bf16() else "none"
    if name not in ("bf16", "none"):
        raise PolicyLoadError(f"autocast {name!r}: use none, bf16 or auto")
    if name == "bf16" and device.type == "cpu" and (why := cpu_bf16_unsupported()):
        raise PolicyLoadError(f"autocast bf16: {why}")
    return name


def autocast_context(name: str, device):
    """The context a run computes in: `bf16` autocast (matrix products in bfloat16, float32 weights),
    `none`, or `auto` (see `resolve_autocast`)."""
    import contextlib

    import torch

    device = torch.device(device) if not isinstance(device, torch.device) else device
    name = resolve_autocast(name, device)
    if name == "none":
        return contextlib.nullcontext()
    # cache_enabled=False: a cached bf16 copy of a weight would outlive the optimizer steps taken inside
    # one context (an SFT epoch), and the forwards would not see the updates.
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)


def end_of_turn_ids(tokenizer, model=None) -> list[int]:
    """The token ids that end an assistant turn: `<|im_end|>` (or another chat end-of-turn token)
    where the vocabulary has it, the tokenizer's eos, and the model's generation-config eos ids."""
    ids: list[int] = []
    vocab = tokenizer.get_vocab()
    for token in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        if token in vocab:
            ids.append(int(vocab[token]))
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    if model is not None and getattr(model, "generation_config", None) is not None:
        eos = model.generation_config.eos_token_id
        ids.extend(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None)
    out = list(dict.fromkeys(ids))
    if not out:
        raise PolicyLoadError("the tokenizer has no end-of-turn token (no <|im_end|> and no eos_token)")
    return out


def load_hf_policy(path: str | Path, *, device: str = "auto", dtype: str = "auto"):
    """A local transformers causal LM and its tokenizer (which must have a chat template).

    `path` is a model folder or a named model (`trainer.models.NAMED_MODELS`: `smollm2-135m`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        path = resolve_model(path)
    except NamedModelError as e:
        raise PolicyLoadError(str(e)) from None
    if not (path / "config.json").is_file():
        raise PolicyLoadError(
            f"{path}: not a folder with a transformers model (no config.json); give a local model folder "
            f"(a Qwen2.5/Qwen3 download, or a trainer run's OUT/model) or a named model ({', '.join(NAMED_MODELS)})"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if not getattr(tokenizer, "chat_template", None):
        raise PolicyLoadError(f"the tokenizer in {path} has no chat template; the policy needs one to read chats")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    dev = resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype, dev)).to(dev)
    own_aligned_storage(model)
    model.eval()
    return model, tokenizer


def own_aligned_storage(model, alignment: int = 64) -> int:
    """Give every CPU weight of `model` its own `alignment`-byte aligned memory; returns how many moved.

    A model loaded from a safetensors file reads its weights where the file is mapped, at addresses
    that are 8-byte aligned only. MKL's matrix-vector kernels round differently by the alignment of
    their operands, so one row through the head gave other log-probs (by ~1e-7) from a loaded model
    than from the same weights made in the process, and a resumed run drifted from an unbroken one.
    A fresh allocation is aligned like every tensor the process makes."""
    moved = 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.device.type == "cpu" and tensor.numel() and tensor.data_ptr() % alignment:
            tensor.data = tensor.data.clone()
            moved += 1
    return moved


@dataclass(frozen=True)
class TinyModelSpec:
    """Sizes of the tiny Qwen3 (defaults: about 0.1M parameters besides the embedding)."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 256
    max_position_embeddings: int = 16384
    tie_word_embeddings: bool = True




def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048):
    """A byte-level BPE trained on `texts`, wrapped as a transformers fast tokenizer with ChatML.

    Byte-level: every string is encodable (no unknown token) and decodes back exactly, and offsets
    map tokens to characters. `<|im_start|>`, `<|im_end|>` (end of turn) and `<|endoftext|>` (pad)
    are special tokens, as in Qwen's tokenizers.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise PolicyLoadError(f"tokenizer vocab_size {vocab_size}: use at least 300 (256 bytes + merges + specials)")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(_CHATML_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator((t for t in texts if t), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def load_tokenizer(path: str | os.PathLike[str]):
    """A transformers tokenizer from a local folder; it must have a chat template."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise PolicyLoadError(f"tokenizer folder {path} does not exist (give --tokenizer PATH, or --tokenizer trained)")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if not getattr(tokenizer, "chat_template", None):
        raise PolicyLoadError(f"the tokenizer in {path} has no chat template; the policy needs one to read chats")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def build_tiny_model(tokenizer, *, seed: int = 0, spec: TinyModelSpec | None = None):
    """A randomly initialised Qwen3 causal LM over `tokenizer`'s vocabulary, the same for the same seed."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    spec = spec or TinyModelSpec()
    eot = end_of_turn_ids(tokenizer)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        **asdict(spec),
        eos_token_id=eot[0],
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = eot
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def load_policy(
    model: str,
    *,
    tokenizer: str | None = "auto",
    corpus: Iterable[str] | None = None,
    vocab_size: int = 2048,
    seed: int = 0,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    tiny: TinyModelSpec | None = None,
) -> tuple[Any, Any]:
    """The policy model (in train mode, on `device`) and its tokenizer.

    Args:
        model: a local folder with a transformers causal LM (and its tokenizer), or `tiny`.
        tokenizer: for `tiny` only: a tokenizer folder, `trained` (BPE on `corpus`), or `auto`
            (the shared Qwen3 tokenizer when present, else `trained`). Ignored for a folder model.
        corpus: texts to train the tokenizer on (`trained`).
        vocab_size: size of the trained tokenizer.
        seed: initialisation seed of the tiny model.
        device, dtype: see `resolve_device` and `resolve_dtype`.
        tiny: sizes of the tiny model.
    """
    import torch

    device = device if isinstance(device, torch.device) else resolve_device(device)
    dtype = dtype if isinstance(dtype, torch.dtype) else resolve_dtype(dtype, device)
    if model == "tiny":
        if tokenizer in (None, "auto"):
            tokenizer = str(DEFAULT_QWEN3_TOKENIZER) if DEFAULT_QWEN3_TOKENIZER.is_dir() else "trained"
        if tokenizer == "trained":
            if corpus is None:
                raise PolicyLoadError("a trained tokenizer needs text to train on (pass corpus=...)")
            tok = train_tokenizer(corpus, vocab_size=vocab_size)
        else:
            tok = load_tokenizer(tokenizer)
        net = build_tiny_model(tok, seed=seed, spec=tiny)
    else:
        net, tok = load_hf_policy(model, device=str(device), dtype=str(dtype).removeprefix("torch."))
    net.to(device=device, dtype=dtype)
    net.train()
    return net, tok


def parameter_count(model) -> int:
    return int(sum(p.numel() for p in model.parameters()))
