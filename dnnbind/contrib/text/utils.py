"""``mx.contrib.text.utils``: counting the tokens of a string. Layer: contrib.text; imports the standard library."""

from __future__ import annotations

import collections
import re

__all__ = ["count_tokens_from_str"]


def count_tokens_from_str(source_str: str, token_delim: str = " ", seq_delim: str = "\n", to_lower: bool = False,
                          counter_to_update: collections.Counter | None = None) -> collections.Counter:
    """Count the tokens of ``source_str``, split at ``token_delim`` or ``seq_delim`` (both regular expressions:
    escape special characters, ``'\\\\*'``), empty pieces dropped, lower-cased with ``to_lower``. Updates and returns
    ``counter_to_update`` when given, else a new Counter."""
    # one split on either delimiter (an alternation), as MXNet's: a token never spans a sequence boundary
    tokens = [t for t in re.split(f"{token_delim}|{seq_delim}", source_str) if t]
    if to_lower:
        tokens = [t.lower() for t in tokens]
    if counter_to_update is None:
        return collections.Counter(tokens)
    counter_to_update.update(tokens)
    return counter_to_update
