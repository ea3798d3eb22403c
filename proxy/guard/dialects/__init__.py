"""The dialect library: one recogniser per tool-call template family leaked into text.

``registry.DIALECTS`` is the table (docs/dialects.md mirrors it); ``matcher.find`` is the one
combined opener scan; ``block.Block`` finds where a block ends; ``segment.WholeSegment`` handles
families without markers; ``suspect.suspicious`` flags call-like text no family recognised.
``proxy.guard.stream.markup.MarkupScanner`` drives them over a stream.
"""

from __future__ import annotations

from proxy.guard.dialects.base import Ctx, Dialect, MarkupError, Parsed
from proxy.guard.dialects.registry import DIALECTS

FAMILIES: tuple[str, ...] = tuple(sorted({d.family for d in DIALECTS}))

__all__ = ["DIALECTS", "FAMILIES", "Ctx", "Dialect", "MarkupError", "Parsed"]
