"""``mx.contrib.text.vocab``: ``Vocabulary``, the index of text tokens. Layer: contrib.text; imports the standard
library.

Index 0 is the unknown token, then the reserved tokens in the order given, then the counter's keys by frequency
(most frequent first; ties in the keys' sort order), each at least ``min_freq`` times, at most
``most_freq_count`` of them: MXNet 1.9.1's order, so a model's indices mean the same tokens.
"""

from __future__ import annotations

import collections

__all__ = ["UNKNOWN_IDX", "Vocabulary"]

UNKNOWN_IDX = 0  # the unknown token's index, always


class Vocabulary:
    """Indexing for text tokens: ``counter`` (a collections.Counter or None), ``most_freq_count`` (None: no cap),
    ``min_freq`` (>= 1), ``unknown_token``, ``reserved_tokens`` (a list without the unknown token or repeats).
    Keys, the unknown token and the reserved tokens are any hashable values of one kind (str, int, tuple)."""

    def __init__(self, counter=None, most_freq_count=None, min_freq=1, unknown_token="<unk>",
                 reserved_tokens=None):
        if not min_freq > 0:
            raise ValueError(f"Vocabulary: `min_freq` must be set to a positive value, got {min_freq}")
        if reserved_tokens is not None:
            if unknown_token in set(reserved_tokens):
                raise ValueError(f"Vocabulary: `reserved_tokens` cannot contain `unknown_token` {unknown_token!r}")
            if len(set(reserved_tokens)) != len(reserved_tokens):
                raise ValueError(f"Vocabulary: `reserved_tokens` cannot contain duplicate reserved tokens, got "
                                 f"{reserved_tokens!r}")
        self._unknown_token = unknown_token
        self._reserved_tokens = None if reserved_tokens is None else list(reserved_tokens)
        self._idx_to_token = [unknown_token] + (self._reserved_tokens or [])
        self._token_to_idx = {t: i for i, t in enumerate(self._idx_to_token)}
        if counter is not None:
            self._index_counter_keys(counter, most_freq_count, min_freq)

    def _index_counter_keys(self, counter, most_freq_count, min_freq) -> None:
        if not isinstance(counter, collections.Counter):
            raise TypeError(f"Vocabulary: `counter` must be an instance of collections.Counter, got "
                            f"{type(counter).__name__}")
        special = set(self._idx_to_token)
        # by frequency, most frequent first; equal frequencies in the keys' order (two stable sorts, as MXNet's)
        by_freq = sorted(sorted(counter.items(), key=lambda kv: kv[0]), key=lambda kv: kv[1], reverse=True)
        # the cap counts the special tokens too (MXNet's: a counter key that is a reserved token takes no slot
        # of its own but the loop still stops when the index reaches the cap)
        cap = len(special) + (len(counter) if most_freq_count is None else most_freq_count)
        for token, freq in by_freq:
            if freq < min_freq or len(self._idx_to_token) == cap:
                break
            if token not in special:
                self._idx_to_token.append(token)
                self._token_to_idx[token] = len(self._idx_to_token) - 1

    def __len__(self) -> int:
        return len(self._idx_to_token)

    def __contains__(self, token) -> bool:
        """Whether ``token`` is indexed (a dnnbind addition: MXNet 1.9.1's Vocabulary has no ``in``)."""
        return token in self._token_to_idx

    @property
    def token_to_idx(self) -> dict:
        return self._token_to_idx

    @property
    def idx_to_token(self) -> list:
        return self._idx_to_token

    @property
    def unknown_token(self):
        return self._unknown_token

    @property
    def reserved_tokens(self):
        return self._reserved_tokens

    def to_indices(self, tokens):
        """A token's index (0 when unknown), or a list of them for a list of tokens."""
        if not isinstance(tokens, list):
            return self._token_to_idx.get(tokens, UNKNOWN_IDX)
        return [self._token_to_idx.get(t, UNKNOWN_IDX) for t in tokens]

    def to_tokens(self, indices):
        """The token at an index, or a list of them for a list of indices. An index past the end, or not an int,
        is a ValueError; a negative one counts from the end (as MXNet's, which indexes a Python list)."""
        single = not isinstance(indices, list)
        out = []
        for idx in [indices] if single else indices:
            if not isinstance(idx, int) or idx > len(self._idx_to_token) - 1:
                raise ValueError(f"Token index {idx} in the provided `indices` is invalid.")
            out.append(self._idx_to_token[idx])
        return out[0] if single else out
