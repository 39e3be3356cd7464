"""Text tokenizers of the VL tasks: open_clip's bundled BPE (default, offline) and a
sentencepiece model numbered as BEiT-3 numbers beit3.spm."""
import pytest

from foundation.config import ConfigError
from foundation_tasks.vl_common.text import EncodedTexts, SentencePieceTokenizer, get_tokenizer, pad_texts


def test_open_clip_tokenizer():
    tok = get_tokenizer("open_clip")
    ids = tok.encode("Is the red circle left of the blue square?", 8)
    assert ids[0] == tok.bos_id == 49406 and ids[-1] == tok.eos_id == 49407 and len(ids) == 8
    assert tok.mask_id == 49408 and tok.size == 49409
    assert tok.decode(tok.encode("a red cube", 16)) == "a red cube"
    ids, pad = pad_texts([[1, 2, 3], [4]], tok.pad_id)
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]] and pad.tolist() == [[False] * 3, [False, True, True]]


def test_sentencepiece_tokenizer_beit3_numbering(tmp_path):
    import sentencepiece as spm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"a {c} {s} is left of a {s2}" for c in ("red", "blue", "green")
                                for s in ("circle", "square") for s2 in ("cube", "cone")) * 20)
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "m"), vocab_size=24,
                                   minloglevel=2)
    tok = get_tokenizer("sentencepiece", str(tmp_path / "m.model"))
    assert isinstance(tok, SentencePieceTokenizer)
    ids = tok.encode("a red circle", 16)
    assert (ids[0], ids[-1]) == (0, 2) and all(4 <= i < tok.mask_id for i in ids[1:-1])
    assert tok.mask_id == 25 and tok.size == 26  # 24 pieces + 1, as XLM-R / BEiT-3
    assert tok.decode(ids) == "a red circle"
    with pytest.raises(ConfigError, match="field 'spm_model'"):
        get_tokenizer("sentencepiece", str(tmp_path / "missing.model"))


def test_encoded_texts_remember_each_text():
    tok = get_tokenizer("open_clip")
    calls = []
    encode = tok.encode
    tok.encode = lambda text, n: calls.append(text) or encode(text, n)
    texts = EncodedTexts(tok, 8)
    ids = texts("Is the red circle left of the blue square?")
    assert ids == encode("Is the red circle left of the blue square?", 8)
    ids.append(0)  # the caller's list: changing it changes nothing kept
    assert texts("Is the red circle left of the blue square?") == ids[:-1] and len(calls) == 1
    texts.LIMIT = 1
    texts("a cube"), texts("a cube")
    assert calls[1:] == ["a cube", "a cube"]  # past the limit: encoded every time, nothing more kept
    with pytest.raises(ValueError, match="no tokens"):
        texts("")
