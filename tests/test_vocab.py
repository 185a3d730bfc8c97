"""The ATR-insert vocabulary: block layout, specials, sentinels, encode/decode."""
from __future__ import annotations

import pytest

from ceu_jax.data.vocab import SENTINELS, SPECIALS, Vocab


def test_block_layout_is_contiguous_and_disjoint():
  v = Vocab(n_filler=3, n_ids=4, n_keys=5, n_values=6)
  assert v.filler_base == len(SPECIALS)
  assert v.id_base == v.filler_base + 3 and v.key_base == v.id_base + 4
  assert v.value_base == v.key_base + 5 and v.size == v.value_base + 6
  strings = v.token_strings()
  assert len(strings) == v.size == len(set(strings))
  assert strings[v.filler_base] == "w_0" and strings[v.id_base + 3] == "#3"
  assert strings[v.key_base] == "k_0" and strings[v.size - 1] == "v_5"


def test_pad_is_zero_and_specials_by_name():
  v = Vocab()
  assert v.pad == 0 == v.tok("[PAD]")
  for i, name in enumerate(SPECIALS):
    assert v.tok(name) == i
  with pytest.raises(KeyError, match="unknown special token"):
    v.tok("[CLS]")


def test_sentinels_are_special_tokens():
  v = Vocab()
  for name, words in SENTINELS.items():
    ids = v.sentinel(name)
    assert len(ids) == len(words) and all(i < v.filler_base for i in ids)
  with pytest.raises(KeyError, match="unknown sentinel"):
    v.sentinel("blank")


def test_encode_decode_roundtrip():
  v = Vocab(n_filler=8, n_ids=8, n_keys=8, n_values=8)
  text = "[P] ID #7 KEY k_0 VALUE v_3 . NOTE w_1 w_7 ."
  ids = v.encode(text)
  assert v.decode(ids) == text
  assert v.encode(text.split()) == ids
  assert v.decode([0, *ids, 0]) == text                        # PAD skipped
  assert v.decode([0], skip_pad=False) == "[PAD]"
  assert v.decode([v.size]) == f"<{v.size}>"                   # out of range shown
  with pytest.raises(KeyError, match="not in the vocabulary"):
    v.encode("v_8")


@pytest.mark.parametrize("field", ["n_filler", "n_ids", "n_keys", "n_values"])
@pytest.mark.parametrize("value", [1, 0, 2.5])
def test_bad_sizes(field, value):
  with pytest.raises(ValueError, match=rf"vocab\.{field} must be an integer >= 2"):
    Vocab(**{field: value})
