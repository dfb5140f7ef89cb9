"""The claims facet of the memory store: the core's own claim rules, applied to the dict."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import replace

from jobrun._core import Claimed, ClaimRequest, claim_candidate, claim_transition
from jobrun._testing.memory.base import MemoryStoreBase


class MemoryClaims(MemoryStoreBase):
    """The claim: ``claim_candidate`` chooses, ``claim_transition`` writes."""

    async def claim(self, request: ClaimRequest) -> Claimed | None:
        row = claim_candidate(builtins.list(self.runs.values()), request)
        if row is None:
            return None
        claimed = claim_transition(row, request)
        self.runs[row.id] = claimed.row
        return claimed

    async def claim_batch(self, request: ClaimRequest, tokens: Sequence[str]) -> list[Claimed]:
        claimed: list[Claimed] = []
        for token in tokens:
            one = await self.claim(replace(request, token=token))
            if one is None:
                break
            claimed.append(one)
        return claimed
