"""A key/value cache with one entry per executed (layer, visit): a looped layer's second visit
computes its own K and V, so it needs its own slot."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values per (layer, visit), each [batch, pos, n_kv_heads, d_head], and for a model
    that hides keys (ModelConfig.hidden_key_ids) which cached positions are hidden [batch, pos]."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._hidden: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def seq_len(self) -> int:
        """Number of positions already cached (0 when empty)."""
        for k, _ in self._entries.values():
            return k.shape[1]
        return 0

    def seq_len_for(self, key: tuple[int, int] | None) -> int:
        """Positions already cached for one (layer, visit): the rotary offset of its next step."""
        entry = self._entries.get(key) if key is not None else None
        return 0 if entry is None else entry[0].shape[1]

    def append(
        self, key: tuple[int, int], k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add this step's k, v for `key` and return all cached k, v for it."""
        if key in self._entries:
            old_k, old_v = self._entries[key]
            k, v = torch.cat([old_k, k], dim=1), torch.cat([old_v, v], dim=1)
        self._entries[key] = (k, v)
        return k, v

    def extend_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Add this step's hidden-key flags [batch, new] and return all of them [batch, pos]:
        one set for every (layer, visit), since a token's flag does not depend on the layer."""
        if self._hidden is not None:
            hidden = torch.cat([self._hidden, hidden], dim=1)
        self._hidden = hidden
        return hidden

    def keys(self) -> list[tuple[int, int]]:
        return list(self._entries)

    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self._entries.values())
