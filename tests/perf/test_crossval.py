"""Leave-one-source-out cross-validation: documents group a publication's rows, and no fold fits on its own rows."""

from __future__ import annotations

import dataclasses

import numpy as np

from gpufleet.perf import crossval
from gpufleet.perf.efficiency import default_efficiency
from gpufleet.perf.ground_truth import read_cases
from gpufleet.perf.validate import predict_case


def _subset(documents: set[str], per_document: int = 2):
    cases, _ = read_cases()
    out, seen = [], {}
    for case in cases:
        doc = crossval.source_document(case)
        if doc in documents and seen.get(doc, 0) < per_document:
            seen[doc] = seen.get(doc, 0) + 1
            out.append(case)
    return out


def test_documents_group_a_publication_and_separate_benchmark_files() -> None:
    cases, _ = read_cases()
    docs = {c.row: crossval.source_document(c) for c in cases}
    # every shipped row maps to a named document, not to its raw source text
    assert all(len(d) < 60 for d in docs.values())
    by_source = {c.source: crossval.source_document(c) for c in cases}
    titan = {d for s, d in by_source.items() if "torchtitan benchmarks/llama3_h100_202412" in s}
    assert len(titan) == 1  # Tables 1-6 of one benchmark file are one document
    assert len({d for s, d in by_source.items() if "torchtitan" in s}) == 4  # three benchmark files, one doc
    assert len({d for s, d in by_source.items() if s.startswith("MegaScale")}) == 1  # its table and its figure
    assert 12 <= len(set(docs.values())) <= len(cases)


def test_exact_folds_never_fit_on_the_left_out_document(monkeypatch) -> None:
    cases = _subset({"Narayanan et al. 2021 (Megatron-LM)", "MT-NLG 2022", "Megatron-LM README (r0.8 table)"})
    fitted_on: list[set[str]] = []

    def spy(train, base, **_):
        fitted_on.append({crossval.source_document(c) for c in train})
        return base, {}

    monkeypatch.setattr(crossval, "calibrate", spy)
    cv = crossval.leave_one_source_out(cases, default_efficiency(), exact=True)
    assert cv.folds.height == 3 and len(fitted_on) == 3
    for fold, seen in zip(cv.folds["document"], fitted_on, strict=True):
        assert fold not in seen
        assert len(seen) == 2
    assert cv.rows.height == len(cases)


def test_chord_folds_evaluate_only_the_other_documents(monkeypatch) -> None:
    cases = _subset({"Narayanan et al. 2021 (Megatron-LM)", "MT-NLG 2022", "llm-foundry MPT benchmarks"})
    monkeypatch.setattr(crossval, "calibrate", lambda train, base, **_: (base, {}))
    calls: list[set[str]] = []
    real = crossval.log_residuals

    def spy(cs, eff, w):
        calls.append({crossval.source_document(c) for c in cs})
        return real(cs, eff, w)

    monkeypatch.setattr(crossval, "log_residuals", spy)
    cv = crossval.leave_one_source_out(cases, default_efficiency(), max_nfev=3)
    fold_calls = [c for c in calls if len(c) < 3]  # the pooled fit's Jacobian sees all three; folds see two
    assert fold_calls and all(len(c) == 2 for c in fold_calls)
    left_out = {next(iter(set(cv.folds["document"]) - c)) for c in fold_calls}
    assert left_out == set(cv.folds["document"])  # every fold ran, each without its own document


def test_a_left_out_measurement_does_not_move_its_own_exact_prediction() -> None:
    cases = _subset({"Narayanan et al. 2021 (Megatron-LM)", "MT-NLG 2022"}, per_document=2)
    base = default_efficiency()
    before = crossval.leave_one_source_out(cases, base, exact=True, max_nfev=2)
    target = next(c for c in cases if crossval.source_document(c) == "MT-NLG 2022")
    moved = [dataclasses.replace(c, target=c.target * 1.5) if c is target else c for c in cases]
    after = crossval.leave_one_source_out(moved, base, exact=True, max_nfev=2)

    def pick(cv: crossval.CrossValidation) -> float:
        return cv.rows.filter(cv.rows["row"] == target.row)["predicted"][0]

    assert np.isclose(pick(before), pick(after), rtol=1e-9)
    # ... while the other document's fold, which fitted on it, moves
    other = before.rows.filter(before.rows["document"] != "MT-NLG 2022")["predicted"].to_numpy()
    other_after = after.rows.filter(after.rows["document"] != "MT-NLG 2022")["predicted"].to_numpy()
    assert not np.allclose(other, other_after, rtol=1e-6)


def test_a_stack_only_in_the_left_out_document_falls_back() -> None:
    cases = _subset({"Narayanan et al. 2021 (Megatron-LM)", "MT-NLG 2022"}, per_document=1)
    cv = crossval.leave_one_source_out(cases, default_efficiency(), max_nfev=2)
    fallback = dict(zip(cv.folds["document"], cv.folds["fallback"], strict=True))
    assert "deepspeed-megatron" in fallback["MT-NLG 2022"]
    assert "megatron-2021" in fallback["Narayanan et al. 2021 (Megatron-LM)"]
    mtnlg = next(c for c in cases if crossval.source_document(c) == "MT-NLG 2022")
    # the fold's prediction is not the shipped constants' (which were fitted on MT-NLG itself)
    shipped = predict_case(mtnlg, default_efficiency())["predicted"]
    got = cv.rows.filter(cv.rows["row"] == mtnlg.row)["predicted"][0]
    assert not np.isclose(got, shipped, rtol=1e-3)
