"""Token bookkeeping for multi-turn rollouts whose tokens were generated, not re-tokenized.

In the OpenRLHF rollout the sequence a policy is trained on is exactly what the model generated
(vLLM token ids) spliced with the tokenized chat framing of the env's feedback. Nothing is
re-tokenized from text, so character spans the env reports (the action block of a turn) are mapped
onto the *generated* ids by decoding them one token at a time:

- `ChatFraming`: the policy's chat template, split into the prompt of turn 0 and the feedback block
  that closes an assistant turn, carries the env's observation as a user turn, and opens the next
  assistant turn. It is read off the tokenizer's own template, so Qwen2.5 and Qwen3 both work.
- `generated_char_offsets`: the character range of each generated token in the decoded text.
- `token_range`: the tokens that overlap a character span.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentgym_opsd.context import Message

__all__ = ["ChatFraming", "generated_char_offsets", "token_range"]

_PLACEHOLDER = "\u2063AGENTGYM_TURN_PLACEHOLDER\u2063"


def generated_char_offsets(tokenizer: Any, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """Decode generated ids and give each token its `(start, end)` character range in the text.

    Special tokens are kept in the text (the env strips nothing; the caller cuts the closing token).
    A token holding only the first bytes of a multi-byte character has an empty range at the
    position where that character starts; `token_range` counts it as covering that character.

    Returns:
        The decoded text and one range per id.
    """
    ids = [int(i) for i in ids]
    stream_step = _decode_stream(tokenizer)
    offsets: list[tuple[int, int]] = []
    pieces: list[str] = []
    length = 0
    if stream_step is not None:
        for token in ids:
            chunk = stream_step(token)
            n = len(chunk) if chunk else 0
            offsets.append((length, length + n))
            if chunk:
                pieces.append(chunk)
            length += n
        return "".join(pieces), offsets
    # Slow path (tokenizers without a streaming decoder): decode growing prefixes. A prefix that
    # ends inside a character decodes it as U+FFFD, so lengths are counted from complete prefixes.
    previous = ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=False)
        if text.endswith("\ufffd"):
            offsets.append((len(previous), len(previous)))
            continue
        offsets.append((len(previous), len(text)))
        previous = text
    return previous, offsets


def _decode_stream(tokenizer: Any):
    """A `token -> new text` function from the `tokenizers` streaming decoder, or None."""
    backend = getattr(tokenizer, "_tokenizer", None)
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:  # older tokenizers
        return None
    if backend is None:
        return None
    stream = DecodeStream(skip_special_tokens=False)
    return lambda token: stream.step(backend, token)


def token_range(offsets: Sequence[tuple[int, int]], span: tuple[int, int] | None) -> tuple[int, int] | None:
    """`(first, last + 1)` of the tokens overlapping the character span `[span[0], span[1])`.

    A token with an empty range (the leading bytes of a character) overlaps the character that starts
    where it stands. Returns None for no span or when no token overlaps it.
    """
    if span is None:
        return None
    a, b = int(span[0]), int(span[1])
    if b <= a:
        return None
    first = last = None
    for i, (s, e) in enumerate(offsets):
        hit = (s < b and e > a) if e > s else (a <= s < b)
        if hit:
            if first is None:
                first = i
            last = i
    return None if first is None else (first, last + 1)


@dataclass
class ChatFraming:
    """The chat template of a tokenizer, split at assistant turns.

    `prompt_ids(messages)` is the tokenized chat up to and including the opening of the first
    assistant turn. `feedback_ids(observation, closed)` is what follows a generated turn: the
    template's end-of-turn text (left out when the model already generated it, `closed=True`), the
    observation as a user turn, and the opening of the next assistant turn.
    """

    tokenizer: Any
    close_text: str
    feedback_template: str  # with "{observation}" where the observation goes
    chat_template_kwargs: dict[str, Any]

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, **chat_template_kwargs: Any) -> ChatFraming:
        """Read the framing off `tokenizer.apply_chat_template`.

        Raises:
            ValueError: the tokenizer has no chat template, or its template does not render an
                assistant turn followed by a user turn in the usual way.
        """
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the policy's tokenizer has no chat template; use an instruct/chat model (Qwen2.5-*-Instruct, Qwen3-*)"
            )
        chat = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": _PLACEHOLDER},
            {"role": "user", "content": "{observation}"},
        ]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, **chat_template_kwargs)
        if text.count(_PLACEHOLDER) != 1 or "{observation}" not in text:
            raise ValueError("cannot split the tokenizer's chat template at an assistant turn")
        after = text.split(_PLACEHOLDER, 1)[1]
        # The end-of-turn token: the first token after an assistant turn's content, when it is a
        # special token (Qwen: <|im_end|>). A model that stops normally generates it itself.
        close_text = ""
        head = list(tokenizer(after, add_special_tokens=False)["input_ids"])[:1]
        if head and head[0] in set(getattr(tokenizer, "all_special_ids", []) or []):
            close_text = tokenizer.decode(head, skip_special_tokens=False)
            if not after.startswith(close_text):
                close_text = ""
        return cls(tokenizer, close_text, after, dict(chat_template_kwargs))

    @property
    def close_id(self) -> int | None:
        """The id of the end-of-turn token, or None when the template has none."""
        return self.encode(self.close_text)[0] if self.close_text else None

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """Token ids of the chat `messages` followed by the opening of an assistant turn."""
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )
        return self.encode(text)

    def feedback_text(self, observation: str, closed: bool) -> str:
        """The text between one generated turn and the next (see the class docstring)."""
        text = self.feedback_template.replace("{observation}", observation, 1)
        if closed and self.close_text and text.startswith(self.close_text):
            text = text[len(self.close_text) :]
        return text

    def feedback_ids(self, observation: str, closed: bool) -> list[int]:
        return self.encode(self.feedback_text(observation, closed))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def split_response(self, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]], bool]:
        """Read one generated turn.

        Returns:
            The turn's text as the env reads it (without a final stop token), the character range of
            each id (a final stop token gets an empty range at the end), and whether the model closed
            the turn itself with the template's end-of-turn token (then the feedback leaves it out).
        """
        ids = [int(i) for i in ids]
        stops = {i for i in (self.close_id, getattr(self.tokenizer, "eos_token_id", None)) if i is not None}
        stopped = bool(ids) and ids[-1] in stops
        text, offsets = generated_char_offsets(self.tokenizer, ids[:-1] if stopped else ids)
        if stopped:
            offsets.append((len(text), len(text)))
        closed = bool(ids) and self.close_id is not None and ids[-1] == self.close_id
        return text, offsets, closed
