"""The policy's chat template in token space: one way to turn chats into the ids a policy reads.

A multi-turn rollout is trained on exactly the ids the policy read and wrote (token-in, token-out,
as OpenRLHF and verl do). The context of turn k + 1 is the context of turn k, the ids sampled in
turn k, and the tokenized chat framing of the env's answer; nothing generated is ever re-tokenized.
Every piece of that is made here, and used alike by the local rollout (`trainer.sampling`), the
OpenRLHF executor (`trainer.openrlhf.rollout`) and the token rows (`trainer.rows`):

- `ChatFraming.for_tokenizer(tokenizer)` reads the template once: the prompt of a chat
  (`prompt_ids`, assistant messages verbatim), and the feedback block that follows a generated turn
  (`feedback_ids`: the template's end-of-turn token when the model did not write it, the
  observation as a user turn, the opening of the next assistant turn).
- `framing_for(tokenizer, **kwargs)`: the framing, with the template read once per distinct chat
  template (the cache holds text, never a tokenizer, so freshly unpickled copies of a tokenizer
  cost nothing and are not kept).
- `generated_char_offsets` / `token_range`: where each generated token sits in the decoded text,
  so the env's character span of the action maps onto the sampled ids.
- `text_turn_tokens(framing, episode, context)`: the ids a text-only agent's episode (the expert,
  an HTTP endpoint) would have had, had the policy written each response as the tokenizer's tokens
  of it: the reconstruction used for warm starts on expert text.
- `render_prompt(tokenizer, messages)`: a chat's prompt text with every assistant message verbatim
  (Qwen3's own template drops earlier turns' `<think>` text).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentgym_opsd.context import ContextPolicy, HistoryItem, Message
from agentgym_opsd.episode import Episode, TurnTokens

__all__ = [
    "ChatFraming",
    "ChatTemplateMismatch",
    "framing_for",
    "generated_char_offsets",
    "token_range",
    "render_prompt",
    "episode_messages",
    "text_turn_tokens",
]

_SENTINEL = "\ue000{}\ue001"  # private-use code points: never in a chat template


class ChatTemplateMismatch(ValueError):
    """The tokenizer's chat template cannot be split into prompt and feedback pieces."""


# ---------------------------------------------------------------------------------------------
# Prompts with verbatim assistant messages


def _render(tokenizer, messages: list[Message], add_generation_prompt: bool, kwargs: dict[str, Any]) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **kwargs)
    if not isinstance(text, str):
        raise ChatTemplateMismatch(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
    return text


def render_prompt(tokenizer, messages: list[Message], **chat_template_kwargs: Any) -> str:
    """The prompt text for `messages` with every assistant message verbatim, ending with the
    template's generation prompt."""
    placeholders, originals = [], []
    for m in messages:
        if m.get("role") == "assistant":
            placeholders.append({**m, "content": _SENTINEL.format(len(originals))})
            originals.append(m["content"])
        else:
            placeholders.append(m)
    text = _render(tokenizer, placeholders, True, chat_template_kwargs)
    for k, original in enumerate(originals):
        mark = _SENTINEL.format(k)
        if text.count(mark) != 1:
            raise ChatTemplateMismatch(
                f"the chat template rendered assistant message {k} {text.count(mark)} times (expected once, verbatim)"
            )
        text = text.replace(mark, original)
    return text


def episode_messages(episode: Episode, k: int, context: str | ContextPolicy | None = None) -> list[Message]:
    """The chat before turn k of `episode` under `context` (default: the episode's own)."""
    policy = ContextPolicy.parse(context if context is not None else episode.context)
    history = [HistoryItem(t.response, t.action, t.observation) for t in episode.turns[:k]]
    return policy.messages(episode.instructions, episode.initial_observation, history)


# ---------------------------------------------------------------------------------------------
# Generated ids -> characters


def generated_char_offsets(tokenizer: Any, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """Decode generated ids and give each token its `(start, end)` character range in the text.

    The text is `tokenizer.decode(ids, skip_special_tokens=False)`, exactly what a policy's turn
    reads as. A token holding only the first bytes of a multi-byte character has an empty range at
    the position where that character starts (`token_range` counts it as covering it); bytes that
    never complete a character decode as U+FFFD, which belongs to the tokens that wrote them.
    """
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    step = _decode_stream(tokenizer)
    if step is not None:
        offsets: list[tuple[int, int]] = []
        chunks: list[str] = []
        length = 0
        for token in ids:
            chunk = step(token) or ""
            offsets.append((length, length + len(chunk)))
            chunks.append(chunk)
            length += len(chunk)
        if text.startswith("".join(chunks)):
            if length < len(text):  # trailing bytes that never completed a character: U+FFFD in the text
                tail = [i for i, (s, e) in enumerate(offsets) if s == e == length] or [len(ids) - 1]
                for i in tail:
                    offsets[i] = (length, len(text))
            return text, offsets
    # Slow path: decode growing prefixes; a prefix ending inside a character is not counted yet.
    offsets = []
    previous = ""
    for i in range(len(ids)):
        prefix = tokenizer.decode(ids[: i + 1], skip_special_tokens=False)
        if prefix.endswith("\ufffd") and i + 1 < len(ids):
            offsets.append((len(previous), len(previous)))
            continue
        offsets.append((len(previous), len(prefix)))
        previous = prefix
    return text, offsets


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


# ---------------------------------------------------------------------------------------------
# The framing


@dataclass
class ChatFraming:
    """The chat template of a tokenizer, split at assistant turns.

    Attributes:
        tokenizer: the policy's tokenizer.
        close_text: the special token that ends an assistant turn (Qwen: `<|im_end|>`), or "" when
            the template closes assistant turns with ordinary text.
        feedback_template: the text between an assistant turn's content and the next generation,
            with "{observation}" where the user turn's content goes.
        generation_prompt: the opening of an assistant turn (what every prompt ends with).
        chat_template_kwargs: passed to `apply_chat_template` (e.g. enable_thinking).
    """

    tokenizer: Any
    close_text: str
    feedback_template: str
    generation_prompt: str
    chat_template_kwargs: dict[str, Any]

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, **chat_template_kwargs: Any) -> ChatFraming:
        """Read the framing off `tokenizer.apply_chat_template`.

        Raises:
            ChatTemplateMismatch: no chat template, or one that does not render an assistant turn
                followed by a user turn in the usual way.
        """
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateMismatch(
                "the policy's tokenizer has no chat template; use an instruct/chat model (Qwen2.5-*-Instruct, Qwen3-*)"
            )
        mark = _SENTINEL.format(0)
        chat = [{"role": "user", "content": "x"}, {"role": "assistant", "content": mark},
                {"role": "user", "content": "{observation}"}]
        text = _render(tokenizer, chat, True, chat_template_kwargs)
        if text.count(mark) != 1 or text.count("{observation}") != 1:
            raise ChatTemplateMismatch("cannot split the tokenizer's chat template at an assistant turn")
        after = text.split(mark, 1)[1]
        one = [{"role": "user", "content": "x"}]
        with_prompt, without = _render(tokenizer, one, True,
                                       chat_template_kwargs), _render(tokenizer, one, False, chat_template_kwargs)
        if not with_prompt.startswith(without):
            raise ChatTemplateMismatch("the chat template's generation prompt is not a suffix of the rendered chat")
        generation_prompt = with_prompt[len(without):]
        if not after.endswith(generation_prompt):
            raise ChatTemplateMismatch(
                f"the chat template's feedback block does not end with its generation prompt {generation_prompt!r}"
            )
        close_text = ""
        special = set(getattr(tokenizer, "all_special_tokens", []) or [])
        for token in sorted(special, key=len, reverse=True):
            if token and after.startswith(token):
                close_text = token
                break
        return cls(tokenizer, close_text, after, generation_prompt, dict(chat_template_kwargs))

    @property
    def close_id(self) -> int | None:
        """The id of the end-of-turn token, or None when the template has none."""
        if not self.close_text:
            return None
        ids = self.encode(self.close_text)
        return ids[0] if len(ids) == 1 else None

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """Token ids of `messages` (assistant messages verbatim) and the opening of an assistant turn."""
        return self.encode(render_prompt(self.tokenizer, messages, **self.chat_template_kwargs))

    def feedback_text(self, observation: str, closed: bool) -> str:
        """The text between one generated turn and the next: the end-of-turn token (left out when
        the model wrote it, `closed`), the observation as a user turn, the next assistant opening."""
        text = self.feedback_template.replace("{observation}", observation, 1)
        if closed and self.close_text:
            text = text[len(self.close_text):]
        return text

    def feedback_ids(self, observation: str, closed: bool) -> list[int]:
        return self.encode(self.feedback_text(observation, closed))

    def split_response(self, ids: Sequence[int],
                       stop_ids: Sequence[int] = ()) -> tuple[str, list[tuple[int, int]], bool]:
        """Read one generated turn.

        Args:
            ids: the sampled ids, ending with the stop id when the model stopped by itself.
            stop_ids: the ids that end a turn (default: the end-of-turn token and eos).

        Returns:
            The turn's text as the env reads it (without the final stop id), the character range of
            each id (the stop id gets an empty range at the end), and whether the model closed the
            turn with the template's end-of-turn token (then the feedback leaves it out).
        """
        ids = [int(i) for i in ids]
        stops = set(stop_ids) or {i for i in (self.close_id, getattr(self.tokenizer, "eos_token_id", None))
                                  if i is not None}
        stopped = bool(ids) and ids[-1] in stops
        text, offsets = generated_char_offsets(self.tokenizer, ids[:-1] if stopped else ids)
        if stopped:
            offsets.append((len(text), len(text)))
        closed = stopped and self.close_id is not None and ids[-1] == self.close_id
        return text, offsets, closed


_TEMPLATES: dict[str, tuple[str, str, str]] = {}  # template key -> (close_text, feedback_template, generation_prompt)
_TEMPLATES_LOCK = threading.Lock()


def template_key(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """What a framing's text depends on: the chat template, its keywords and the special tokens
    (equal for every copy of one tokenizer, whatever Python object holds it)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (
        str(getattr(tokenizer, "chat_template", "")),
        repr(sorted((chat_template_kwargs or {}).items())),
        repr(sorted(getattr(tokenizer, "all_special_tokens", []) or [])),
    ):
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


def framing_for(tokenizer: Any, **chat_template_kwargs: Any) -> ChatFraming:
    """The framing of `tokenizer`: the template is read once per distinct template (`template_key`),
    and the framing returned encodes with the tokenizer given.

    The cache holds text only, never a tokenizer: OpenRLHF hands every rollout call a freshly
    unpickled tokenizer (about 85 MiB for Qwen3), and a cache keyed by the object would keep each one.
    """
    key = template_key(tokenizer, chat_template_kwargs)
    with _TEMPLATES_LOCK:
        text = _TEMPLATES.get(key)
    if text is None:
        framing = ChatFraming.for_tokenizer(tokenizer, **chat_template_kwargs)
        with _TEMPLATES_LOCK:
            _TEMPLATES[key] = (framing.close_text, framing.feedback_template, framing.generation_prompt)
        return framing
    return ChatFraming(tokenizer, *text, dict(chat_template_kwargs))


# ---------------------------------------------------------------------------------------------
# Episodes played by text agents


def text_turn_tokens(framing: ChatFraming, episode: Episode,
                     context: str | ContextPolicy | None = None) -> list[TurnTokens]:
    """The ids of an episode played by a text agent, as a token-level policy would have had them.

    Each response becomes the tokenizer's tokens of it followed by the end-of-turn token (unless
    the turn was cut at a token cap, `turn.info["finish_reason"] == "length"`); contexts are built
    exactly as a rollout builds them (`full`: the feedback block after each turn; `window:k`: each
    turn's prompt rendered afresh).
    """
    policy = ContextPolicy.parse(context if context is not None else episode.context)
    close = framing.close_id
    out: list[TurnTokens] = []
    for k, turn in enumerate(episode.turns):
        if policy.kind == "full" and k > 0:
            previous = out[-1]
            closed = previous.finish_reason == "stop" and close is not None
            prompt, extends = framing.feedback_ids(episode.turns[k - 1].observation, closed), True
        else:
            prompt, extends = framing.prompt_ids(episode_messages(episode, k, policy)), False
        cut = str(turn.info.get("finish_reason", "")) == "length"
        sampled = framing.encode(turn.response) + ([close] if close is not None and not cut else [])
        out.append(TurnTokens(prompt, extends, sampled, [], "length" if cut or close is None else "stop"))
    return out
