"""The operator's prices: ``ModelPrice`` rows, versioned (a change is a new row in force from its time on).

USD per million tokens. ``model`` is a glob over the upstream model name (``deepseek-*``, ``*``);
``upstream`` a glob over the upstream's name, blank for any. The serving processes read them through
``billing.book`` (with the shipped defaults of ``billing/prices.json`` beneath them). A request's cost is
stored on its audit rows when it ends, so a later price never changes what an old request was charged.
"""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone


def _usd(label: str, help_text: str, *, optional: bool = False) -> models.DecimalField:  # type: ignore[type-arg]
    return models.DecimalField(
        label,
        max_digits=14,
        decimal_places=6,
        validators=[MinValueValidator(0)],
        null=optional,
        blank=optional,
        help_text=help_text,
    )


class ModelPrice(models.Model):
    """One price of the map, in force from ``effective_from`` until a later row with the same globs."""

    model = models.CharField(max_length=200, help_text="Glob over the upstream model name, e.g. deepseek-* or *.")
    upstream = models.CharField(
        max_length=200, blank=True, default="", help_text="Glob over the upstream's name; blank: any upstream."
    )
    input_usd = _usd("input", "USD per million fresh input tokens.")
    output_usd = _usd("output", "USD per million output tokens.")
    cache_read_usd = _usd(
        "cache read", "USD per million input tokens read from the cache; blank: input.", optional=True
    )
    cache_write_usd = _usd(
        "cache write", "USD per million input tokens written to the cache; blank: input.", optional=True
    )
    reasoning_usd = _usd("reasoning", "USD per million reasoning tokens; blank: output.", optional=True)
    effective_from = models.DateTimeField(
        default=timezone.now, db_index=True, help_text="In force from this time on (requests before keep their price)."
    )
    source = models.CharField(max_length=300, blank=True, default="operator")
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["model", "upstream", "-effective_from"]
        indexes = [models.Index(fields=["model", "upstream", "-effective_from"], name="price_globs_from")]

    def __str__(self) -> str:
        at = f" at {self.upstream}" if self.upstream else ""
        since = f"{self.effective_from:%Y-%m-%d}"
        return f"{self.model}{at}: ${self.input_usd} in / ${self.output_usd} out per M (from {since})"
