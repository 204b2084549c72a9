"""Token bookkeeping on the real Qwen3 tokenizer: chat framing and char-to-token maps of generated ids."""

from __future__ import annotations

import pickle
import random

import pytest

import trainer.chat as chat
from trainer.chat import ChatFraming, framing_for, generated_char_offsets, token_range


def test_framing_reproduces_the_chat_template_turn_by_turn(qwen3_tokenizer):
    tok = qwen3_tokenizer
    framing = ChatFraming.for_tokenizer(tok)
    messages = [{"role": "system", "content": "Rules."}, {"role": "user", "content": "You see a desk."}]
    prompt = framing.prompt_ids(messages)
    turn = "<action>go to desk 1</action>"
    generated = tok(turn, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    text, offsets, closed = framing.split_response(generated)
    assert (text, closed) == (turn, True)
    sequence = prompt + generated + framing.feedback_ids("On the desk: a pen.", closed)
    full_chat = messages + [{"role": "assistant", "content": turn}, {"role": "user", "content": "On the desk: a pen."}]
    expected = tok.apply_chat_template(full_chat, tokenize=False, add_generation_prompt=True)
    assert tok.decode(sequence) == expected
    # A turn cut by the length limit has no end-of-turn token: the feedback supplies it.
    cut = tok("<action>go to", add_special_tokens=False)["input_ids"]
    text, _, closed = framing.split_response(cut)
    assert not closed
    assert framing.feedback_text("x", closed).startswith("<|im_end|>")
    assert not framing.feedback_text("x", True).startswith("<|im_end|>")


def test_char_offsets_of_generated_ids_with_multibyte_text(qwen3_tokenizer):
    tok = qwen3_tokenizer
    text = "思考: é🙂 <action>put 苹果 in 冰箱 1</action> done"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    decoded, offsets = generated_char_offsets(tok, ids)
    assert decoded == text
    assert len(offsets) == len(ids)
    # Some byte-level token holds part of a character (the emoji is 4 bytes).
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces)
    # Every character is covered, in order, by exactly the tokens whose bytes encode it.
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    for (s0, e0), (s1, _) in zip(offsets, offsets[1:]):
        assert s1 == e0 and e0 >= s0
    start = text.index("<action>")
    end = text.index("</action>") + len("</action>")
    first, last = token_range(offsets, (start, end))
    assert tok.decode(ids[first:last]).strip() == text[start:end]
    assert first > 0 and last < len(ids)


def test_action_tag_split_across_tokens(qwen3_tokenizer):
    tok = qwen3_tokenizer
    text = "ok<action>look</action>."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    _, offsets = generated_char_offsets(tok, ids)
    span = (text.index("<action>"), text.index(".") )
    first, last = token_range(offsets, span)
    covered = tok.decode(ids[first:last])
    assert "<action>look</action>" in covered
    # The tokens cover the span and no more than the tokens it touches.
    assert offsets[first][0] <= span[0] < offsets[first][1]
    assert offsets[last - 1][0] < span[1] <= offsets[last - 1][1]


@pytest.mark.parametrize("span", [None, (3, 3), (5, 2)])
def test_token_range_of_an_empty_or_missing_span_is_none(span):
    assert token_range([(0, 2), (2, 4), (4, 9)], span) is None


def test_framing_needs_a_chat_template(qwen3_tokenizer):
    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="chat template"):
        ChatFraming.for_tokenizer(NoTemplate())


def test_offsets_of_random_ids_cover_the_decoded_text(qwen3_tokenizer):
    """An untrained policy samples ids whose bytes are not valid UTF-8 (mid-text and at the end):
    the text is exactly what `decode` gives, and the offsets cover it in order."""
    tok = qwen3_tokenizer
    rng = random.Random(0)
    vocab = tok.vocab_size
    replacement = 0
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        text, offsets = generated_char_offsets(tok, ids)
        assert text == tok.decode(ids, skip_special_tokens=False)
        assert len(offsets) == len(ids) and offsets[0][0] == 0
        assert max(e for _, e in offsets) == len(text)
        for (s0, e0), (s1, e1) in zip(offsets, offsets[1:]):
            assert s1 == e0 or (s1 == s0 and e1 == e0)  # in order; tail tokens may share the last characters
        replacement += text.endswith("\ufffd")
    assert replacement > 0  # the test met ids ending inside a character


def test_the_framing_cache_keeps_no_tokenizer_however_many_unpickled_copies(qwen3_tokenizer):
    """OpenRLHF sends each rollout call a freshly unpickled tokenizer: the cache must not grow with the
    calls nor keep the copies alive (it held one ~85 MiB tokenizer per call when it was keyed by id()),
    and each framing encodes with the tokenizer it was given (two trained tokenizers share a template)."""
    import gc
    import weakref

    from trainer.policy import train_tokenizer

    small = train_tokenizer(["<action>go to desk 1</action>", "You see a desk."] * 20, vocab_size=300)
    for tokenizer, copies in ((small, 100), (qwen3_tokenizer, 3)):  # the real one is slow to unpickle
        framing_for(tokenizer)
        size = len(chat._TEMPLATES)
        blob = pickle.dumps(tokenizer)
        alive = []
        for _ in range(copies):
            copy = pickle.loads(blob)
            framing = framing_for(copy)
            assert framing.tokenizer is copy and framing.encode("You see a desk.") == tokenizer("You see a desk.")[
                "input_ids"]
            alive.append(weakref.ref(copy))
            del copy, framing
        gc.collect()
        assert len(chat._TEMPLATES) == size and not any(ref() is not None for ref in alive)
    other = train_tokenizer(["completely different words here", "zebra yak xylophone"] * 20, vocab_size=300)
    assert framing_for(other).encode("zebra") == other("zebra")["input_ids"] != small("zebra")["input_ids"]
    assert framing_for(qwen3_tokenizer, enable_thinking=False).generation_prompt.endswith("</think>\n\n")
