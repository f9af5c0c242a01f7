"""``mx.contrib.text.embedding``: token embeddings (a Vocabulary with a vector per token). Layer: contrib.text;
imports nd, runtime and gluon.data's MXNET_HOME helper.

- ``GloVe`` and ``FastText`` read MXNet's pre-trained files (names: ``get_pretrained_file_names()``) from
  ``embedding_root/<glove|fasttext>/<file>``, ``embedding_root`` defaulting to ``$MXNET_HOME/embeddings``
  (``~/.mxnet/embeddings``; read on each call, where MXNet fixes it at import). dnnbind never downloads: a missing
  file is a FileNotFoundError naming the file, the folder to put it in and the URL MXNet would have fetched (an
  archive to unpack there). MXNet also re-downloads a file whose SHA-1 differs from its table's; here a file
  present is read as it is.
- ``CustomEmbedding`` reads any file of lines ``token<delim>v1<delim>v2...``.
- ``CompositeEmbedding`` concatenates several embeddings' vectors for a vocabulary's tokens.

Loading follows MXNet 1.9.1 line by line: the first vector of a token wins (a repeat is skipped with a warning), a
line with a single number (fastText's ``count dim`` header) is skipped with a warning, every vector must have one
length, and row 0 (the unknown token) is the file's vector for ``unknown_token`` if it has one, else
``init_unknown_vec(shape=vec_len)`` (``nd.zeros``). ``idx_to_vec`` is a float32 NDArray.
"""

from __future__ import annotations

import logging
import os
import warnings

import numpy as np

from ... import nd
from ...gluon.data._home import data_dir
from ...runtime.array import NDArray
from . import _pretrained
from .vocab import UNKNOWN_IDX, Vocabulary

__all__ = ["CompositeEmbedding", "CustomEmbedding", "FastText", "GloVe", "TokenEmbedding", "create",
           "get_pretrained_file_names", "register"]

log = logging.getLogger("dnnbind.contrib.text")

_REGISTRY: dict[str, type] = {}  # lower-cased class name -> TokenEmbedding subclass


def register(embedding_cls: type) -> type:
    """Register a TokenEmbedding subclass under its lower-cased class name (``create`` finds it there); used as a
    class decorator. Registering a name again replaces the old class, with a warning (as MXNet's registry)."""
    if not (isinstance(embedding_cls, type) and issubclass(embedding_cls, TokenEmbedding)):
        raise TypeError(f"register: can only register a subclass of TokenEmbedding, got {embedding_cls!r}")
    name = embedding_cls.__name__.lower()
    old = _REGISTRY.get(name)
    if old is not None and old is not embedding_cls:
        warnings.warn(f"New token embedding {embedding_cls.__module__}.{embedding_cls.__name__} registered with name "
                      f"{name} is overriding existing token embedding {old.__module__}.{old.__name__}", UserWarning,
                      stacklevel=2)
    _REGISTRY[name] = embedding_cls
    return embedding_cls


def create(embedding_name: str, **kwargs) -> "TokenEmbedding":
    """An instance of the registered embedding ``embedding_name`` (case-insensitive), made with ``kwargs``
    (``create('glove', pretrained_file_name='glove.6B.50d.txt')``)."""
    cls = _REGISTRY.get(str(embedding_name).lower())
    if cls is None:
        raise KeyError(f"create: {embedding_name!r} is not a registered token embedding (registered: "
                       f"{', '.join(sorted(_REGISTRY))}); register it with embedding.register first")
    return cls(**kwargs)


def get_pretrained_file_names(embedding_name: str | None = None):
    """The pre-trained file names of ``embedding_name`` (a list), or of every registered embedding (a dict)."""
    if embedding_name is not None:
        cls = _REGISTRY.get(str(embedding_name).lower())
        if cls is None:
            raise KeyError(f"Cannot find `embedding_name` {embedding_name}. Use `get_pretrained_file_names("
                           "embedding_name=None).keys()` to get all the valid embedding names.")
        return list(cls.pretrained_file_name_sha1)
    return {name: list(cls.pretrained_file_name_sha1) for name, cls in _REGISTRY.items()}


class TokenEmbedding(Vocabulary):
    """The base of every token embedding (MXNet's ``_TokenEmbedding``): a Vocabulary whose indices map to the rows
    of ``idx_to_vec`` ((len, vec_len)). ``kwargs`` go to Vocabulary (``unknown_token``, ``reserved_tokens``)."""

    pretrained_file_name_sha1: dict = {}

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._vec_len = None
        self._idx_to_vec = None

    # -- files ---------------------------------------------------------------------------------------------------

    @classmethod
    def _archive_name(cls, pretrained_file_name: str) -> str:
        return pretrained_file_name

    @classmethod
    def _check_pretrained_file_names(cls, pretrained_file_name: str) -> None:
        name = cls.__name__.lower()
        if pretrained_file_name not in cls.pretrained_file_name_sha1:
            raise KeyError(f"Cannot find pretrained file {pretrained_file_name} for token embedding {name}. Valid "
                           f"pretrained files for embedding {name}: {', '.join(cls.pretrained_file_name_sha1)}")

    @classmethod
    def _pretrained_file(cls, embedding_root, pretrained_file_name: str) -> str:
        """The file's path under ``embedding_root``; FileNotFoundError, saying where to put it, if it is not there."""
        cls._check_pretrained_file_names(pretrained_file_name)
        root = os.path.join(data_dir(), "embeddings") if embedding_root is None else embedding_root
        folder = os.path.join(os.path.expanduser(os.fspath(root)), cls.__name__.lower())
        path = os.path.join(folder, pretrained_file_name)
        if not os.path.isfile(path):
            repo = os.environ.get("MXNET_GLUON_REPO", _pretrained.APACHE_REPO_URL)
            archive = cls._archive_name(pretrained_file_name)
            url = f"{repo}gluon/embeddings/{cls.__name__.lower()}/{archive}"
            unpack = f" (unpack {pretrained_file_name} from that archive)" if archive != pretrained_file_name else ""
            raise FileNotFoundError(
                f"{cls.__name__}: the pre-trained file {pretrained_file_name} is not in {folder}. dnnbind does not "
                f"download: put the file there (MXNet would fetch {url}{unpack}), set MXNET_HOME to the folder that "
                f"holds embeddings/{cls.__name__.lower()}/, or pass embedding_root=.")
        return path

    def _load_embedding(self, pretrained_file_path, elem_delim: str, init_unknown_vec, encoding: str = "utf8"):
        path = os.path.expanduser(os.fspath(pretrained_file_path))
        if not os.path.isfile(path):
            raise ValueError(f"`pretrained_file_path` must be a valid path to the pre-trained token embedding file, "
                             f"got {pretrained_file_path!r}")
        log.info("Loading pre-trained token embedding vectors from %s", path)
        vec_len, rows, seen, unknown_vec = None, [], set(), None
        with open(path, "r", encoding=encoding) as f:
            for line_num, line in enumerate(f, 1):
                elems = line.rstrip().split(elem_delim)
                if len(elems) < 2:
                    raise ValueError(f"At line {line_num} of the pre-trained text embedding file: the data format of "
                                     f"the pre-trained token embedding file {path} is unexpected.")
                token, values = elems[0], [float(v) for v in elems[1:]]
                if token == self._unknown_token and unknown_vec is None:
                    unknown_vec = values
                    seen.add(token)
                elif token in seen:
                    warnings.warn(f"At line {line_num} of the pre-trained token embedding file: the embedding vector "
                                  f"for token {token} has been loaded and a duplicate embedding for the  same token "
                                  "is seen and skipped.")
                elif len(values) == 1:  # fastText's "count dim" first line
                    warnings.warn(f"At line {line_num} of the pre-trained text embedding file: token {token} with "
                                  f"1-dimensional vector {values} is likely a header and is skipped.")
                else:
                    if vec_len is None:
                        vec_len = len(values)
                    elif len(values) != vec_len:
                        raise ValueError(f"At line {line_num} of the pre-trained token embedding file: the dimension "
                                         f"of token {token} is {len(values)} but the dimension of previous tokens is "
                                         f"{vec_len}. Dimensions of all the tokens must be the same.")
                    rows.append(values)
                    self._idx_to_token.append(token)
                    self._token_to_idx[token] = len(self._idx_to_token) - 1
                    seen.add(token)
        if vec_len is None:
            raise ValueError(f"the pre-trained token embedding file {path} holds no token vectors")
        self._vec_len = vec_len
        # row 0 is the unknown token's; the reserved tokens (indexed before the file's) keep zero rows, as MXNet's
        table = np.zeros((len(self._idx_to_token), vec_len), np.float32)
        first = len(self._idx_to_token) - len(rows)
        table[first:] = np.asarray(rows, np.float32)
        if unknown_vec is not None:
            table[UNKNOWN_IDX] = np.asarray(unknown_vec, np.float32)
        self._idx_to_vec = nd.array(table)
        if unknown_vec is None:
            self._idx_to_vec[UNKNOWN_IDX] = init_unknown_vec(shape=vec_len)

    # -- vocabulary ----------------------------------------------------------------------------------------------

    def _index_tokens_from_vocabulary(self, vocabulary: Vocabulary) -> None:
        self._token_to_idx = dict(vocabulary.token_to_idx)
        self._idx_to_token = list(vocabulary.idx_to_token)
        self._unknown_token = vocabulary.unknown_token
        self._reserved_tokens = None if vocabulary.reserved_tokens is None else list(vocabulary.reserved_tokens)

    def _set_idx_to_vec_by_embeddings(self, token_embeddings: list, vocab_len: int, vocab_idx_to_token: list):
        """Rows for ``vocab_idx_to_token``: each embedding's vectors side by side, row 0 their unknown vectors."""
        new_vec_len = sum(e.vec_len for e in token_embeddings)
        table = nd.zeros((vocab_len, new_vec_len))
        col = 0
        for e in token_embeddings:
            end = col + e.vec_len
            table[0, col:end] = e.idx_to_vec[0]
            if vocab_len > 1:
                table[1:, col:end] = e.get_vecs_by_tokens(list(vocab_idx_to_token[1:]))
            col = end
        self._vec_len, self._idx_to_vec = new_vec_len, table

    def _build_embedding_for_vocabulary(self, vocabulary) -> None:
        if vocabulary is not None:
            if not isinstance(vocabulary, Vocabulary):
                raise TypeError("The argument `vocabulary` must be an instance of "
                                "mxnet.contrib.text.vocab.Vocabulary.")
            self._set_idx_to_vec_by_embeddings([self], len(vocabulary), vocabulary.idx_to_token)
            self._index_tokens_from_vocabulary(vocabulary)

    # -- vectors -------------------------------------------------------------------------------------------------

    @property
    def vec_len(self) -> int:
        return self._vec_len

    @property
    def idx_to_vec(self) -> NDArray:
        return self._idx_to_vec

    def get_vecs_by_tokens(self, tokens, lower_case_backup: bool = False) -> NDArray:
        """The vector of a token ((vec_len,)), or of a list of tokens ((len, vec_len)); an unknown token gets row 0.
        ``lower_case_backup`` looks a token up lower-cased when it is not found as given."""
        single = not isinstance(tokens, list)
        tokens = [tokens] if single else tokens
        get = self._token_to_idx.get
        if lower_case_backup:
            indices = [get(t) if t in self._token_to_idx else get(t.lower(), UNKNOWN_IDX) for t in tokens]
        else:
            indices = [get(t, UNKNOWN_IDX) for t in tokens]
        table = self._idx_to_vec
        vecs = nd.Embedding(nd.array(indices, ctx=table.device), table, input_dim=table.shape[0],
                            output_dim=table.shape[1])
        return vecs[0] if single else vecs

    def update_token_vectors(self, tokens, new_vectors: NDArray) -> None:
        """Replace the vectors of ``tokens`` (a token, or a list) with the rows of ``new_vectors`` ((len, vec_len);
        1-D for one token). The unknown token is updated only when named as ``unknown_token``; any other unknown
        token is a ValueError (no silent update of row 0)."""
        if self._idx_to_vec is None:
            raise ValueError("The property `idx_to_vec` has not been properly set.")
        if not isinstance(tokens, list) or len(tokens) == 1:
            if not isinstance(new_vectors, NDArray) or new_vectors.ndim not in (1, 2):
                raise ValueError("`new_vectors` must be a 1-D or 2-D NDArray if `tokens` is a singleton.")
            tokens = tokens if isinstance(tokens, list) else [tokens]
            if new_vectors.ndim == 1:
                new_vectors = new_vectors.reshape((1, -1))
        elif not isinstance(new_vectors, NDArray) or new_vectors.ndim != 2:
            raise ValueError("`new_vectors` must be a 2-D NDArray if `tokens` is a list of multiple strings.")
        if new_vectors.shape != (len(tokens), self.vec_len):
            raise ValueError(f"The length of new_vectors must be equal to the number of tokens and the width of "
                             f"new_vectors must be equal to the dimension of embeddings of the glossary: got shape "
                             f"{new_vectors.shape} for {len(tokens)} token(s) of dimension {self.vec_len}.")
        indices = []
        for t in tokens:
            if t not in self._token_to_idx:
                raise ValueError(f"Token {t} is unknown. To update the embedding vector for an unknown token, please "
                                 f"specify it explicitly as the `unknown_token` {self._idx_to_token[UNKNOWN_IDX]} in "
                                 "`tokens`. This is to avoid unintended updates.")
            indices.append(self._token_to_idx[t])
        self._idx_to_vec[np.array(indices, np.int64)] = new_vectors.as_in_context(self._idx_to_vec.device)


_TokenEmbedding = TokenEmbedding  # MXNet's name for the base class




@register
class GloVe(TokenEmbedding):
    """GloVe vectors (https://nlp.stanford.edu/projects/glove/) from ``embedding_root/glove/<pretrained_file_name>``
    (default ``$MXNET_HOME/embeddings``); ``vocabulary`` (optional) picks and orders the tokens indexed."""

    pretrained_file_name_sha1 = _pretrained.GLOVE_FILES
    pretrained_archive_name_sha1 = _pretrained.GLOVE_ARCHIVES

    @classmethod
    def _archive_name(cls, pretrained_file_name: str) -> str:
        # glove.6B.50d.txt comes in glove.6B.zip: the archive whose second dotted part is the file's
        by_part = {a.split(".")[1]: a for a in cls.pretrained_archive_name_sha1}
        return by_part[pretrained_file_name.split(".")[1]]

    def __init__(self, pretrained_file_name: str = "glove.840B.300d.txt", embedding_root=None,
                 init_unknown_vec=nd.zeros, vocabulary=None, **kwargs):
        path = GloVe._pretrained_file(embedding_root, pretrained_file_name)
        super().__init__(**kwargs)
        self._load_embedding(path, " ", init_unknown_vec)
        self._build_embedding_for_vocabulary(vocabulary)


@register
class FastText(TokenEmbedding):
    """fastText vectors (https://fasttext.cc/) from ``embedding_root/fasttext/<pretrained_file_name>`` (a ``.vec``
    file with its ``count dim`` header line; default ``$MXNET_HOME/embeddings``)."""

    pretrained_file_name_sha1 = _pretrained.FASTTEXT_FILES
    pretrained_archive_name_sha1 = _pretrained.FASTTEXT_ARCHIVES

    @classmethod
    def _archive_name(cls, pretrained_file_name: str) -> str:
        return ".".join(pretrained_file_name.split(".")[:-1]) + ".zip"  # wiki.simple.vec comes in wiki.simple.zip

    def __init__(self, pretrained_file_name: str = "wiki.simple.vec", embedding_root=None,
                 init_unknown_vec=nd.zeros, vocabulary=None, **kwargs):
        path = FastText._pretrained_file(embedding_root, pretrained_file_name)
        super().__init__(**kwargs)
        self._load_embedding(path, " ", init_unknown_vec)
        self._build_embedding_for_vocabulary(vocabulary)


class CustomEmbedding(TokenEmbedding):
    """Vectors from a file of lines ``token<elem_delim>v1<elem_delim>v2...`` at ``pretrained_file_path``."""

    def __init__(self, pretrained_file_path, elem_delim: str = " ", encoding: str = "utf8",
                 init_unknown_vec=nd.zeros, vocabulary=None, **kwargs):
        super().__init__(**kwargs)
        self._load_embedding(pretrained_file_path, elem_delim, init_unknown_vec, encoding)
        self._build_embedding_for_vocabulary(vocabulary)


class CompositeEmbedding(TokenEmbedding):
    """The tokens of ``vocabulary``, each with the vectors of ``token_embeddings`` (one embedding or a list)
    concatenated in that order."""

    def __init__(self, vocabulary: Vocabulary, token_embeddings):
        if not isinstance(vocabulary, Vocabulary):
            raise TypeError("The argument `vocabulary` must be an instance of mxnet.contrib.text.vocab.Vocabulary.")
        if not isinstance(token_embeddings, list):
            token_embeddings = [token_embeddings]
        for e in token_embeddings:
            if not isinstance(e, TokenEmbedding):
                raise TypeError("The argument `token_embeddings` must be an instance or a list of instances of "
                                f"TokenEmbedding, got {type(e).__name__}")
        self._index_tokens_from_vocabulary(vocabulary)
        self._set_idx_to_vec_by_embeddings(token_embeddings, len(self), self.idx_to_token)
