"""Guard policy fields in the admin: "inherit (default: …)" instead of "Unknown" or a ``null`` text box.

On a tenant the inherited value is the product default (``GuardPolicy()``); on a route it is its
tenant's effective value. Every policy column is nullable or blank: blank / None = inherit.
Read-only pages (viewers) get :func:`policy_summary`, one table with the same wording.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from proxy.guard.policy import Exhaustion, FragmentStorage, GuardPolicy, Repair
from tenants.models import PolicyFields, Tenant

INHERIT = "inherit"
#: Option values are ``str(True)`` / ``str(False)``, so a stored value renders as selected.
_YES_NO = {"True": True, "False": False}


def policy_defaults(tenant: Tenant | None) -> dict[str, Any]:
    """What each policy column inherits: the tenant's effective values, or the product's without one."""
    policy = tenant.policy() if tenant is not None else GuardPolicy()
    return {"max_retries": policy.max_retries, "stream_text": policy.stream_text, "early_abort": policy.early_abort,
            "exhaustion": policy.exhaustion.value, "allowed_repairs": sorted(r.value for r in policy.repairs),
            "fragment_storage": policy.fragments.value, "retention_days": policy.retention_days,
            "loop_breaker": policy.loop_breaker, "loop_repeats": policy.loop_repeats,
            "loop_cycle_repeats": policy.loop_cycle_repeats, "loop_exhausted_turns": policy.loop_exhausted_turns,
            "loop_exempt_tools": sorted(policy.loop_exempt_tools), "retry_budget_percent": policy.retry_budget_percent,
            "trace_content": policy.trace_content}


def shown(value: Any) -> str:
    """A policy value in words: yes / no, ``all 7 repairs``, ``no repairs``, the value."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        if len(value) == len(Repair):
            return f"all {len(Repair)} repairs"
        return ", ".join(value) if value else "no repairs"
    return str(value)


def _inherit(default: Any) -> str:
    return f"{INHERIT} (default: {shown(default)})"


def _choice(field: forms.Field, default: Any, values: list[tuple[str, str]]) -> forms.Field:
    return forms.TypedChoiceField(choices=[("", _inherit(default)), *values], required=False, empty_value="",
                                  label=field.label, help_text=field.help_text)


def _yes_no(field: forms.Field, default: Any) -> forms.Field:
    return forms.TypedChoiceField(choices=[("", _inherit(default)), ("True", "yes"), ("False", "no")], required=False,
                                  coerce=_yes_no_value, empty_value=None, label=field.label,
                                  help_text=field.help_text)


def _yes_no_value(value: Any) -> bool | None:
    """``"True"`` / ``"False"`` (posted) or a stored bool -> the bool; blank -> None (inherit)."""
    return value if isinstance(value, bool) or value is None else _YES_NO.get(value)


def _number(field: forms.Field, default: Any) -> forms.Field:
    field.widget.attrs["placeholder"] = _inherit(default)
    field.help_text = f"{field.help_text} Blank: {_inherit(default)}."
    return field


class RepairsField(forms.MultipleChoiceField):
    """Tick "inherit" (None) or the repairs allowed (none ticked: no repairs, ``[]``)."""

    def __init__(self, *, default: list[str], **kwargs: Any) -> None:
        choices = [(INHERIT, _inherit(default)), *((r.value, r.value) for r in Repair)]
        super().__init__(choices=choices, required=False, widget=forms.CheckboxSelectMultiple, **kwargs)

    def prepare_value(self, value: Any) -> Any:
        return [INHERIT] if value is None else value

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return bool(self.clean(data) != initial)
        except forms.ValidationError:
            return True

    def clean(self, value: Any) -> list[str] | None:
        picked = super().clean(value)
        if INHERIT in picked:
            if len(picked) > 1:
                raise forms.ValidationError("Untick “inherit” to choose the repairs yourself.")
            return None
        return sorted(picked)


class ToolNamesField(forms.CharField):
    """Tool names, comma- or space-separated; blank = inherit (None); ``-`` = none (``[]``)."""

    def __init__(self, *, default: list[str], **kwargs: Any) -> None:
        super().__init__(required=False, **kwargs)
        self.widget.attrs["placeholder"] = _inherit(", ".join(default) or "none")
        self.help_text = f"{self.help_text} Comma-separated; blank: inherit; '-': none."

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list):
            return ", ".join(str(v) for v in value) or "-"
        return value

    def clean(self, value: Any) -> list[str] | None:
        text = (super().clean(value) or "").strip()
        if not text:
            return None
        if text == "-":
            return []
        names = sorted({n for n in text.replace(",", " ").split() if n})
        if any(len(n) > 64 for n in names):
            raise forms.ValidationError("A tool name is at most 64 characters.")
        return names


class PolicyFormMixin(forms.ModelForm):  # type: ignore[type-arg]
    """Replaces the policy columns' form fields; ``inherited_from`` names where defaults come from."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        defaults = policy_defaults(self.inherited_from())
        for name in PolicyFields.POLICY_FIELDS:
            field = self.fields.get(name)
            if field is not None:
                self.fields[name] = self._policy_field(name, field, defaults[name])

    def inherited_from(self) -> Tenant | None:
        """The tenant whose values this row inherits (None: the product defaults)."""
        return None

    @staticmethod
    def _policy_field(name: str, field: forms.Field, default: Any) -> forms.Field:
        if name in ("stream_text", "early_abort", "loop_breaker", "trace_content"):
            return _yes_no(field, default)
        if name == "exhaustion":
            return _choice(field, default, [(e.value, e.value) for e in Exhaustion])
        if name == "fragment_storage":
            return _choice(field, default, [(f.value, f.value) for f in FragmentStorage])
        if name == "allowed_repairs":
            return RepairsField(default=default, label=field.label, help_text="Deterministic repairs allowed.")
        if name == "loop_exempt_tools":
            return ToolNamesField(default=default, label=field.label, help_text=field.help_text)
        return _number(field, default)


def policy_summary(row: PolicyFields, tenant: Tenant | None) -> SafeString:
    """Every policy column of ``row`` as a table: its value, or "inherit (default: …)"."""
    defaults = policy_defaults(tenant)
    rows = []
    for name in PolicyFields.POLICY_FIELDS:
        value = getattr(row, name)
        if name == "loop_exempt_tools":
            value, default = (", ".join(value) or "none") if isinstance(value, list) else value, \
                ", ".join(defaults[name]) or "none"
            text = _inherit(default) if value is None else value
        else:
            text = _inherit(defaults[name]) if value is None or value == "" else shown(value)
        rows.append((name.replace("_", " "), text))
    return format_html("<table>{}</table>", format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows))
