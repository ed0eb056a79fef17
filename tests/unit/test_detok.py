"""Incremental detokenizer: streamed pieces reassemble to decode(), never split a character."""

from __future__ import annotations

import json
import random
from functools import lru_cache

import pytest
from serverproc import tiny_tokenizer
from tinymodels import CORPUS

from lmi_trt.serving.detok import MAX_HELD_TOKENS, IncrementalDetokenizer, is_byte_level, make_decode, make_token_cache

TEXTS = [*CORPUS, "Grüße 日本語 🚀🔥✨ Straße", "🚀🚀🚀 東京", "a  b   c\n\n  d", " leading and trailing "]


@lru_cache(maxsize=1)
def _sentencepiece_tokenizer():
    """A Llama-style tokenizer: Metaspace '▁' spaces, byte fallback, leading-space strip on decode.

    Trained on ASCII/German only, so Japanese and emoji go through <0xNN> byte tokens — one
    character spans several tokens, as with Llama on rare characters.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    ascii_corpus = [f"{line} {i}" for i in range(200) for line in CORPUS if line.isascii() or "Grüße" in line]
    tok.train_from_iterator(
        ascii_corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    )
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    base = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = base + b
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)), bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def tok(request):
    return tiny_tokenizer() if request.param == "byte_level" else _sentencepiece_tokenizer()


def _stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.step(i) for i in ids] + [detok.finish()]


def _decode(tok, ids, skip=True):
    return tok.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)


def test_sentencepiece_fixture_really_splits_characters():
    sp = _sentencepiece_tokenizer()
    ids = sp.encode("日本", add_special_tokens=False)
    assert len(ids) >= 6  # 3 byte tokens per character (plus the '▁' prefix)
    assert "\ufffd" in sp.decode(ids[:2])


def test_make_decode_matches_tokenizer_decode(tok):
    ids = tok.encode(TEXTS[3], add_special_tokens=False)
    assert make_decode(tok, True)(ids) == _decode(tok, ids)


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_concatenate_to_decode_and_never_split_a_character(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    pieces = _stream(IncrementalDetokenizer(tok), ids)
    assert "".join(pieces) == _decode(tok, ids)
    assert not any("\ufffd" in p for p in pieces), pieces
    assert sum(1 for p in pieces if p) > 1  # it really streamed


@pytest.mark.parametrize("text", TEXTS)
def test_prompt_context_keeps_the_first_tokens_space(tok, text):
    prompt = "Once upon a time"
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    gen_ids = (
        tok.encode(" " + text, add_special_tokens=False)
        if tok is tiny_tokenizer()
        else tok.encode(text, add_special_tokens=False)
    )
    out = "".join(_stream(IncrementalDetokenizer(tok, prompt_ids), gen_ids))
    full = _decode(tok, prompt_ids + gen_ids)
    head = _decode(tok, prompt_ids)
    assert full.startswith(head)
    assert out == full[len(head) :]
    assert out.startswith(" ")  # SentencePiece would drop it when decoding gen_ids alone


def test_special_tokens_skipped_or_kept():
    tok = tiny_tokenizer()
    ids = (
        tok.encode("Grüße", add_special_tokens=False)
        + [tok.eos_token_id]
        + tok.encode(" 日本", add_special_tokens=False)
    )
    skipped = "".join(_stream(IncrementalDetokenizer(tok, skip_special_tokens=True), ids))
    kept = "".join(_stream(IncrementalDetokenizer(tok, skip_special_tokens=False), ids))
    assert skipped == "Grüße 日本" == _decode(tok, ids, skip=True)
    assert kept == "Grüße</s> 日本" == _decode(tok, ids, skip=False)


def test_cost_per_token_stays_flat():
    """The decoded window never grows with the output: no O(n²) re-decoding."""
    tok = tiny_tokenizer()
    base = make_decode(tok, True)
    windows: list[int] = []

    def recording(ids: list[int]) -> str:
        windows.append(len(ids))
        return base(ids)

    ids = tok.encode(" ".join(TEXTS), add_special_tokens=False) * 30  # thousands of tokens
    detok = IncrementalDetokenizer(tok, decode=recording)
    out = "".join(_stream(detok, ids))
    assert out == _decode(tok, ids)
    assert len(ids) > 3000
    assert max(windows) <= 2 * MAX_HELD_TOKENS
    assert len(windows) <= 2 * len(ids) + 2  # two small decodes per token at most


@pytest.mark.parametrize("seed", range(40))
def test_random_ids_match_decode_even_with_invalid_bytes(seed):
    """A random model emits broken UTF-8; the stream still equals decode().

    Byte-level only: SentencePiece's ByteFallback decoder renders a whole run of byte tokens
    as U+FFFDs once any byte in it is invalid, so a later byte rewrites an earlier valid one
    and no streaming detokenizer can match decode() there (it does for valid text, above).
    """
    tok = tiny_tokenizer()
    rng = random.Random(seed)
    specials = set(tok.all_special_ids)
    ids = [i for i in (rng.randrange(len(tok)) for _ in range(300)) if i not in specials]
    assert "".join(_stream(IncrementalDetokenizer(tok), ids)) == _decode(tok, ids)


def test_unfinished_character_at_the_end_is_flushed_as_decode_shows_it():
    tok = tiny_tokenizer()
    ids = tok.encode("日本語", add_special_tokens=False)[:-1]
    assert "\ufffd" in _decode(tok, ids)
    detok = IncrementalDetokenizer(tok)
    streamed = "".join(detok.step(i) for i in ids)
    assert "\ufffd" not in streamed
    assert streamed + detok.finish() == _decode(tok, ids)


def _plain(tok) -> IncrementalDetokenizer:
    """The method without any shortcut (a decode function of unknown kind gets none)."""
    base = make_decode(tok, True)
    return IncrementalDetokenizer(tok, decode=lambda ids: base(ids))


@pytest.mark.parametrize("seed", range(20))
def test_shared_cache_and_byte_level_shortcut_give_the_same_pieces(tok, seed):
    """Piece for piece (not only joined), the shared TokenCache (one-token lengths, and the
    byte-level shortcut that skips the decoder) agrees with the plain method, on text and on
    random ids with broken UTF-8, with and without prompt context, reused across requests."""
    rng = random.Random(seed)
    specials = set(tok.all_special_ids)
    text_ids = tok.encode(rng.choice(TEXTS) + " " + rng.choice(TEXTS), add_special_tokens=False)
    random_ids = [i for i in (rng.randrange(len(tok)) for _ in range(200)) if i not in specials]
    cache = make_token_cache(tok, True)
    for ids in (text_ids, random_ids, text_ids + random_ids[:7] + text_ids):
        for prompt in ([], text_ids[:9], random_ids[-3:]):
            shared = IncrementalDetokenizer(tok, prompt, cache=cache)
            plain = IncrementalDetokenizer(tok, prompt, decode=make_decode(tok, True))
            assert _stream(shared, ids) == _stream(plain, ids)
            if not prompt and (tok is tiny_tokenizer() or ids is text_ids):
                assert "".join(_stream(IncrementalDetokenizer(tok, cache=cache), ids)) == _decode(tok, ids)


def test_byte_level_shortcut_skips_the_decoder_on_plain_text():
    tok = tiny_tokenizer()
    assert is_byte_level(tok) and not is_byte_level(_sentencepiece_tokenizer())
    cache = make_token_cache(tok, True)
    calls: list[int] = []
    decode = cache.decode
    cache.decode = lambda ids: calls.append(len(ids)) or decode(ids)
    ids = tok.encode(" ".join(CORPUS), add_special_tokens=False)
    for t in ids:  # warm the per-token tables (filled on first use, once per server)
        cache.pieces[t], cache.lengths[t]
    detok = IncrementalDetokenizer(tok, ids[:3], cache=cache)
    calls.clear()
    out = "".join(_stream(detok, ids[3:]))
    assert out == _decode(tok, ids)[len(_decode(tok, ids[:3])) :]
    assert len(calls) < len(ids) // 4  # only multi-byte characters still go through the decoder
