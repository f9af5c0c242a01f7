"""``dnnbind.contrib.text`` (MXNet 1.9.1's ``mx.contrib.text``) against what the real MXNet gives for the same tiny
files and strings (tests/fixtures/mxnet_text/text.json, written by tests/fixtures/make_mxnet_text.py): token
counts, Vocabulary order and indices, GloVe / fastText / custom files, vocabularies on embeddings, composite
embeddings, vector updates; and the files read from disk only (MXNET_HOME, embedding_root, the error when missing).
"""

from __future__ import annotations

import collections
import json
import os
import warnings

import numpy as np
import pytest

from dnnbind import nd
from dnnbind.contrib import text
from dnnbind.contrib.text import embedding, utils, vocab
from tests._helpers import assert_close

with open(os.path.join(os.path.dirname(__file__), "fixtures", "mxnet_text", "text.json")) as _f:
    MX = json.load(_f)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An MXNET_HOME holding the fixture's GloVe and fastText files where MXNet keeps them."""
    monkeypatch.setenv("MXNET_HOME", str(tmp_path))
    for cls, name in (("glove", "glove.6B.50d.txt"), ("fasttext", "wiki.simple.vec")):
        (tmp_path / "embeddings" / cls).mkdir(parents=True)
        (tmp_path / "embeddings" / cls / name).write_text(MX["files"][name], encoding="utf8")
    (tmp_path / "custom.tsv").write_text(MX["files"]["custom.tsv"], encoding="utf8")
    return tmp_path


def _counter():
    return utils.count_tokens_from_str(MX["text"], " ", "\n", True)


def _check_embedding(e, want, name):
    assert e.idx_to_token == want["idx_to_token"], name
    assert e.token_to_idx == {t: i for i, t in enumerate(want["idx_to_token"])}, name
    assert e.vec_len == want["vec_len"] and len(e) == len(want["idx_to_token"]), name
    assert e.idx_to_vec.dtype == np.float32
    assert_close(e.idx_to_vec, np.array(want["idx_to_vec"], np.float32), rtol=0, atol=0, name=f"{name} idx_to_vec")
    for q, vecs in want["queries"].items():
        got = e.get_vecs_by_tokens(json.loads(q))
        assert_close(got, np.array(vecs, np.float32), rtol=0, atol=0, name=f"{name} get_vecs_by_tokens({q})")
    assert_close(e.get_vecs_by_tokens(["The", "OF", "Hello", "WORLD", "zz"], lower_case_backup=True),
                 np.array(want["lower"], np.float32), rtol=0, atol=0, name=f"{name} lower_case_backup")


# -- utils and vocab ----------------------------------------------------------------------------------------------

def test_count_tokens_matches_mxnet():
    assert dict(_counter()) == MX["count_lower"]
    assert dict(utils.count_tokens_from_str("*Life*is*great*!*\n*life*is*good*.*\n", "\\*", "\\n")) == \
        MX["count_star"]
    updated = collections.Counter({"life": 10})
    assert utils.count_tokens_from_str(MX["text"], counter_to_update=updated) is updated
    assert dict(updated) == MX["count_update"]


@pytest.mark.parametrize("case", sorted(MX["vocabs"]))
def test_vocabulary_matches_mxnet(case):
    want = MX["vocabs"][case]
    v = vocab.Vocabulary(_counter(), **want["kwargs"])
    assert v.idx_to_token == want["idx_to_token"]
    assert v.token_to_idx == want["token_to_idx"]
    assert len(v) == want["len"]
    assert v.to_indices(["great", "nope", "life", "<pad>"]) == want["to_indices"]
    assert v.to_indices("nope") == 0
    assert v.to_tokens(list(range(len(v)))) == want["to_tokens"]
    assert v.to_tokens(0) == v.unknown_token == want["kwargs"].get("unknown_token", "<unk>")
    assert ("great" in v) == ("great" in want["token_to_idx"]) and "nope" not in v


def test_vocabulary_refusals():
    with pytest.raises(ValueError, match="min_freq"):
        vocab.Vocabulary(min_freq=0)
    with pytest.raises(ValueError, match="cannot contain `unknown_token`"):
        vocab.Vocabulary(reserved_tokens=["<unk>"])
    with pytest.raises(ValueError, match="duplicate"):
        vocab.Vocabulary(reserved_tokens=["a", "a"])
    with pytest.raises(TypeError, match="collections.Counter"):
        vocab.Vocabulary({"a": 1})
    v = vocab.Vocabulary(collections.Counter("abca"))
    with pytest.raises(ValueError, match="Token index 9 in the provided `indices` is invalid"):
        v.to_tokens([1, 9])
    with pytest.raises(ValueError, match="Token index 1.0"):
        v.to_tokens(1.0)
    assert v.to_tokens(-1) == v.idx_to_token[-1]  # a Python list index, as MXNet's


# -- embeddings ---------------------------------------------------------------------------------------------------

def test_glove_and_fasttext_from_mxnet_home_match_mxnet(home):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        glove = embedding.GloVe("glove.6B.50d.txt")
        fast = embedding.create("FastText", pretrained_file_name="wiki.simple.vec")
    messages = [str(w.message) for w in caught]
    assert any("duplicate embedding for the  same token" in m for m in messages)  # "of" repeated
    assert any("likely a header and is skipped" in m for m in messages)  # the .vec header line
    _check_embedding(glove, MX["glove"], "GloVe")
    _check_embedding(fast, MX["fasttext"], "FastText")
    assert "the" in glove and "missing" not in glove


def test_custom_and_vocabulary_and_composite_match_mxnet(home):
    _check_embedding(embedding.CustomEmbedding(str(home / "custom.tsv"), elem_delim="\t"), MX["custom"], "custom")
    v = vocab.Vocabulary(_counter(), most_freq_count=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _check_embedding(embedding.GloVe("glove.6B.50d.txt", vocabulary=v), MX["glove_vocab"], "GloVe on a vocab")
        glove, fast = embedding.GloVe("glove.6B.50d.txt"), embedding.FastText()
    _check_embedding(embedding.CompositeEmbedding(v, [glove, fast]), MX["composite"], "composite")


def test_update_token_vectors_matches_mxnet(home):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        glove = embedding.GloVe("glove.6B.50d.txt", embedding_root=str(home / "embeddings"))
    glove.update_token_vectors(["the", "<unk>"], nd.array([[7, 8, 9], [-7, -8, -9]]))
    glove.update_token_vectors("and", nd.array([4, 5, 6]))
    assert_close(glove.idx_to_vec, np.array(MX["updated"], np.float32), rtol=0, atol=0, name="updated idx_to_vec")
    with pytest.raises(ValueError, match="Token nope is unknown"):
        glove.update_token_vectors("nope", nd.array([1, 2, 3]))
    with pytest.raises(ValueError, match="must be equal to the number of tokens"):
        glove.update_token_vectors(["the", "of"], nd.ones((2, 4)))


def test_reserved_tokens_keep_their_own_rows(tmp_path):
    """MXNet 1.9.1 gives a file's vectors one row too early when reserved tokens are indexed before them ('a' gets
    'b''s vector); here each token has its own row and a reserved token a zero one."""
    f = tmp_path / "e.txt"
    f.write_text("a 1 1\nb 2 2\n")
    e = embedding.CustomEmbedding(str(f), reserved_tokens=["<pad>"])
    assert e.idx_to_token == ["<unk>", "<pad>", "a", "b"]
    assert_close(e.get_vecs_by_tokens(["a", "b", "<pad>", "zz"]), [[1, 1], [2, 2], [0, 0], [0, 0]], rtol=0, atol=0)


def test_init_unknown_vec(tmp_path):
    f = tmp_path / "e.txt"
    f.write_text("a 1 2\n")
    e = embedding.CustomEmbedding(str(f), init_unknown_vec=nd.ones)
    assert_close(e.get_vecs_by_tokens("zz"), [1, 1], rtol=0, atol=0)


def test_registry_and_pretrained_names():
    names = embedding.get_pretrained_file_names()
    assert {k: sorted(v) for k, v in names.items()} == {k: sorted(v) for k, v in MX["pretrained"].items()}
    assert embedding.get_pretrained_file_names("glove") == MX["pretrained"]["glove"]
    with pytest.raises(KeyError, match="Cannot find `embedding_name` word2vec"):
        embedding.get_pretrained_file_names("word2vec")
    with pytest.raises(KeyError, match="Cannot find pretrained file glove.7B.txt for token embedding glove"):
        embedding.create("glove", pretrained_file_name="glove.7B.txt")
    with pytest.raises(KeyError, match="'word2vec' is not a registered token embedding"):
        embedding.create("word2vec")

    @embedding.register
    class MyEmbed(embedding.TokenEmbedding):
        def __init__(self, size=2):
            super().__init__()
            self.size = size

    try:
        assert embedding.create("myembed", size=3).size == 3
    finally:
        embedding._REGISTRY.pop("myembed")


def test_missing_file_fails_fast_saying_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MXNET_HOME", str(tmp_path))
    monkeypatch.delenv("MXNET_GLUON_REPO", raising=False)
    folder = os.path.join(str(tmp_path), "embeddings", "glove")
    with pytest.raises(FileNotFoundError) as info:
        embedding.GloVe("glove.6B.100d.txt")
    msg = str(info.value)
    assert "glove.6B.100d.txt" in msg and folder in msg and "does not download" in msg
    assert "https://apache-mxnet.s3-accelerate.dualstack.amazonaws.com/gluon/embeddings/glove/glove.6B.zip" in msg
    with pytest.raises(FileNotFoundError, match=r"gluon/embeddings/fasttext/wiki\.en\.zip"):
        embedding.FastText("wiki.en.vec", embedding_root=str(tmp_path / "elsewhere"))
    assert not os.path.exists(folder)  # nothing created, nothing fetched


def test_package_layout():
    assert text.embedding is embedding and text.vocab is vocab and text.utils is utils
    assert issubclass(embedding.GloVe, vocab.Vocabulary) and embedding._TokenEmbedding is embedding.TokenEmbedding
