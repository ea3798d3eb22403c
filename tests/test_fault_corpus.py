"""The project's own corpus covers every fault kind on its own (a fresh clone has no ../shared beside it),
and a shared id resolves to the own fixture mirroring it when the shared corpus is absent."""

from __future__ import annotations

from typing import Any

from proxy.simulator.cases import CaseLibrary
from proxy.simulator.faults import FAULTS
from tests.fault_corpus import OWN_DIR, SHARED_DIR, load


def _own() -> list[dict[str, Any]]:
    return [load(p) for p in sorted(OWN_DIR.glob("D*.json"))]


def test_the_own_corpus_has_a_case_of_every_kind_the_suite_tests() -> None:
    kinds = {case["kind"] for case in _own()}
    assert set(FAULTS) <= kinds, sorted(set(FAULTS) - kinds)
    mirrored = {str(case["mirrors"]) for case in _own() if "mirrors" in case}
    assert {fault.case for fault in FAULTS.values()} <= mirrored


def test_every_own_case_cites_its_sources() -> None:
    for case in _own():
        urls = case["source_urls"]
        assert isinstance(urls, list) and urls and all(str(u).startswith("https://") for u in urls), case["id"]


def test_a_shared_id_resolves_to_its_mirror_without_the_shared_corpus() -> None:
    library = CaseLibrary(None, extra=(OWN_DIR,))
    for fault in FAULTS.values():
        case = library.get(fault.case)
        assert case["mirrors"] == fault.case and case["kind"] == fault.kind
    assert library.get("c14")["id"] == library.get("C14")["id"]


def test_each_mirror_has_the_kind_and_action_of_the_shared_case_when_present() -> None:
    if not SHARED_DIR.is_dir():  # a fresh clone: the checks above hold on their own
        return
    for case in _own():
        if "mirrors" in case:
            shared = load(SHARED_DIR / f"{case['mirrors']}.json")
            assert (case["kind"], case["expected"]["action"]) == (shared["kind"], shared["expected"]["action"])
    assert {load(p)["kind"] for p in SHARED_DIR.glob("C*.json")} <= {c["kind"] for c in _own()}
