"""Compare runs (#/compare, views/compare.js) in a real Chromium against the stubbed API, with jobs
whose metrics are known: two runs overlay two curves, the smoothing slider redraws them as the
debiased EMA of the points (checked against a Python EMA), the x axis by tokens seen, the accuracy
charts or their empty message, the hyperparameters with the differing ones highlighted, a live run
polled until it ends, and the ways in: the jobs list's ticks and the compare page's own picker.
Screenshots: tests/artifacts/compare_stub.png and compare_stub_dark.png (look at them)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.dashboard.conftest import ARTIFACTS
from tests.dashboard.stub_api import StubApi, StubJobs, job_object, sign_in_with_stub

A = "ftjob-" + "a" * 18 + "c0ffee"
B = "ftjob-" + "b" * 18 + "beef02"
C = "ftjob-" + "c" * 18 + "cafe03"
ARCH = {"n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 64, "ctx": 64}
TRAIN = {"batch_size": 8, "learning_rate": 0.001, "eval_every": 5, "export_formats": ["gguf", "hf"]}


def points(steps: int, loss: Any, *, accuracy: bool, tokens_per_step: int, eval_every: int = 5) -> list[Any]:
    """Metrics points as GET /metrics gives them: train loss loss(step), val every eval_every steps,
    token accuracy (train and val) when `accuracy`, else null."""
    out = []
    for s in range(1, steps + 1):
        evaluated = s % eval_every == 0
        out.append({
            "step": s, "train_loss": loss(s), "val_loss": loss(s) + 0.25 if evaluated else None,
            "train_accuracy": 0.1 + 0.02 * s if accuracy else None,
            "val_accuracy": 0.08 + 0.02 * s if accuracy and evaluated else None,
            "lr": 1e-3, "tokens_per_s": 1000.0, "tokens_seen": s * tokens_per_step, "grad_norm": 1.0,
            "created_at": 1_700_000_000 + s,
        })  # fmt: skip
    return out


POINTS_A = points(20, lambda s: 4 - 0.1 * s + 0.3 * (-1) ** s, accuracy=True, tokens_per_step=512)
POINTS_B = points(16, lambda s: 3.8 - 0.08 * s + 0.2 * math.cos(s), accuracy=False, tokens_per_step=1024)


def py_ema(ys: list[float], weight: float) -> list[float]:
    """The smoothing the page must draw: an EMA from 0, divided by 1 - weight^n (debiased)."""
    out, avg = [], 0.0
    for n, y in enumerate(ys, start=1):
        avg = avg * weight + (1 - weight) * y
        out.append(y if weight == 0 else avg / (1 - weight**n))
    return out


def stub(page: Any) -> tuple[StubApi, StubJobs]:
    api = StubApi(page)
    jobs = StubJobs(api)
    jobs.add(
        job_object(C, suffix="gamma", seed=3, step=12, total_steps=12, architecture=ARCH, train=TRAIN),
        points(12, lambda s: 3.5 - 0.05 * s, accuracy=False, tokens_per_step=512),
    )
    jobs.add(
        job_object(A, suffix="alpha", seed=1, step=20, total_steps=20, architecture=ARCH, train=TRAIN),
        POINTS_A,
    )
    jobs.add(job_object(B, suffix="beta", seed=2, step=16, total_steps=16, architecture=ARCH,
                        train={**TRAIN, "learning_rate": 0.0005}), POINTS_B)  # fmt: skip
    return api, jobs


def open_compare(new_page: Any, static_url: str, ids: list[str], **size: int) -> tuple[Any, Any, StubApi]:
    page, log = new_page(**size)
    api, _ = stub(page)
    sign_in_with_stub(page, static_url, "#/compare?jobs=" + ",".join(ids))
    page.wait_for_selector("#compare:not([data-state=loading])")
    return page, log, api


def drawn(page: Any, panel: str) -> dict[str, Any]:
    """{job id: {xs, raw, smoothed}} as the panel's chart was last given them."""
    runs = page.evaluate("id => document.getElementById(id).drawn", f"cmp-{panel}")
    return {r["id"]: r for r in runs}


def set_smoothing(page: Any, weight: float) -> None:
    page.locator("#cmp-smoothing").evaluate(
        "(el, v) => { el.value = v; el.dispatchEvent(new Event('input', { bubbles: true })); }", str(weight)
    )


def painted(page: Any) -> None:
    page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")


def test_ema_smoothing_is_debiased(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    page.goto(static_url + "/")
    ys = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    result = page.evaluate(
        """async (ys) => {
        const { ema } = await import('/js/views/compare/ema.js');
        return {
            w0: ema(ys, 0), w5: ema(ys, 0.5), w99: ema(ys, 0.99),
            constant: ema([2, 2, 2, 2], 0.9),   // debiased: a flat curve stays flat from its first point
            first: ema([7, 1], 0.95)[0],        // the first point is itself, not 5% of it
            gaps: ema([1, null, 3, NaN, 5], 0.5),
        };
    }""",
        ys,
    )
    assert result["w0"] == ys
    assert result["w5"] == pytest.approx(py_ema(ys, 0.5))
    assert result["w99"] == pytest.approx(py_ema(ys, 0.99))
    assert result["w5"][1] == pytest.approx((0.25 * 3 + 0.5 * 1) / 0.75)  # by hand: 1.6667
    assert result["constant"] == pytest.approx([2, 2, 2, 2])
    assert result["first"] == pytest.approx(7)
    # a missing value stays missing and does not enter the average
    gaps = result["gaps"]
    assert gaps[1] is None and math.isnan(gaps[3])
    assert [gaps[0], gaps[2], gaps[4]] == pytest.approx(py_ema([1, 3, 5], 0.5))
    assert log.errors() == []


def test_two_runs_overlay_with_a_legend(new_page: Any, static_url: str) -> None:
    page, log, api = open_compare(new_page, static_url, [A, B])
    assert page.get_by_role("link", name="Compare").get_attribute("aria-current") == "page"
    rows = page.locator("#cmp-runs tbody tr")
    assert rows.evaluate_all("rs => rs.map((r) => r.dataset.jobId)") == [A, B]
    assert rows.nth(0).locator("th").inner_text().strip() == "alpha · c0ffee"
    assert rows.nth(1).locator("th").inner_text().strip() == "beta · beef02"
    assert rows.nth(1).locator(".badge").inner_text() == "succeeded"
    colors = rows.locator(".swatch").evaluate_all("ss => ss.map((s) => s.style.background)")
    assert len(set(colors)) == 2

    train = drawn(page, "train-loss")
    assert set(train) == {A, B}
    assert train[A]["xs"] == list(range(1, 21)) and train[B]["xs"] == list(range(1, 17))
    assert train[A]["raw"] == pytest.approx([p["train_loss"] for p in POINTS_A])
    assert train[B]["raw"] == pytest.approx([p["train_loss"] for p in POINTS_B])
    val = drawn(page, "val-loss")
    assert val[A]["xs"] == [5, 10, 15, 20] and val[B]["xs"] == [5, 10, 15]
    # both curves painted: a smoothed one and its raw one behind it (default smoothing 0.6)
    page.wait_for_selector(f"#cmp-train-loss[data-points-{A}='20'][data-points-{B}='16']")
    assert page.get_attribute("#cmp-train-loss", f"data-points-{A}-raw") == "20"
    # one request each for the job and its downsampled history; finished runs are not polled
    assert api.calls[f"GET /fine_tuning/jobs/{A}/metrics"] == 1
    assert api.calls[f"GET /fine_tuning/jobs/{B}"] == 1
    assert page.get_attribute("#compare", "data-state") == "done"

    # the hover read-out: each run's value at the step under the pointer
    box = page.locator("#cmp-train-loss").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    page.wait_for_selector("#cmp-train-loss[data-readout]")
    readout = page.get_attribute("#cmp-train-loss", "data-readout").split("\n")
    assert readout[0].startswith("step ")
    assert readout[1].startswith("alpha · c0ffee: ") and "(raw " in readout[1]
    assert readout[2].startswith("beta · beef02: ")
    assert log.errors() == [], log.messages


def test_the_smoothing_slider_redraws_the_ema(new_page: Any, static_url: str) -> None:
    page, log, _ = open_compare(new_page, static_url, [A, B])
    raw_a = [p["train_loss"] for p in POINTS_A]
    assert page.input_value("#cmp-smoothing") == "0.6"
    assert drawn(page, "train-loss")[A]["smoothed"] == pytest.approx(py_ema(raw_a, 0.6))

    set_smoothing(page, 0)
    painted(page)
    assert page.inner_text("#cmp-smoothing-value") == "0.00"
    train = drawn(page, "train-loss")
    assert train[A]["smoothed"] == pytest.approx(raw_a)  # nothing smoothed: the raw curve alone
    assert page.get_attribute("#cmp-train-loss", f"data-points-{A}-raw") is None
    unsmoothed = page.locator("#cmp-train-loss").evaluate("c => c.toDataURL()")

    set_smoothing(page, 0.9)
    painted(page)
    assert page.get_attribute("#cmp-train-loss", "data-smoothing") == "0.9"
    train = drawn(page, "train-loss")
    assert train[A]["smoothed"] == pytest.approx(py_ema(raw_a, 0.9))
    assert train[B]["smoothed"] == pytest.approx(py_ema([p["train_loss"] for p in POINTS_B], 0.9))
    # a sparse series (4 evaluations) is never smoothed: its raw points, bold, and no faint copy
    val = drawn(page, "val-loss")[A]
    assert (
        val["smoothed"]
        == val["raw"]
        == pytest.approx([p["val_loss"] for p in POINTS_A if p["val_loss"] is not None])
    )
    assert val["weight"] == 0 and page.get_attribute("#cmp-val-loss", f"data-points-{A}-raw") is None
    assert page.locator("#cmp-train-loss").evaluate("c => c.toDataURL()") != unsmoothed  # drawn anew
    assert page.get_attribute("#cmp-train-loss", f"data-points-{A}-raw") == "20"

    # the keyboard moves it a step at a time; the weight is remembered for the next visit
    page.focus("#cmp-smoothing")
    page.keyboard.press("ArrowRight")
    assert page.input_value("#cmp-smoothing") == "0.91"
    assert drawn(page, "train-loss")[A]["smoothed"] == pytest.approx(py_ema(raw_a, 0.91))
    page.reload()
    page.wait_for_selector("#compare:not([data-state=loading])")
    assert page.input_value("#cmp-smoothing") == "0.91"

    # x by tokens seen
    page.select_option("#cmp-x", "tokens_seen")
    train = drawn(page, "train-loss")
    assert train[A]["xs"] == [s * 512 for s in range(1, 21)] and train[B]["xs"] == [
        s * 1024 for s in range(1, 17)
    ]
    painted(page)
    box = page.locator("#cmp-train-loss").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.4, box["y"] + box["height"] * 0.5)
    page.wait_for_selector("#cmp-train-loss[data-readout^='tokens seen ']")

    # x by wall-clock time: seconds since each run's first point
    page.select_option("#cmp-x", "time")
    train = drawn(page, "train-loss")
    assert train[A]["xs"] == list(range(20)) and train[B]["xs"] == list(range(16))
    painted(page)
    assert page.get_attribute("#cmp-train-loss", "data-x-ticks").split("|")[0] == "0s"
    assert page.get_attribute("#cmp-train-loss", "data-x-labels-fit") == "true"
    assert log.errors() == [], log.messages


def test_accuracy_charts_or_the_empty_message(new_page: Any, static_url: str) -> None:
    page, log, _ = open_compare(new_page, static_url, [A, B])
    assert page.get_attribute("#cmp-accuracy", "data-state") == "charts"
    assert page.locator("#cmp-no-accuracy").is_hidden()
    accuracy = drawn(page, "train-accuracy")
    assert accuracy[A]["raw"] == pytest.approx([0.1 + 0.02 * s for s in range(1, 21)])
    assert accuracy[B]["xs"] == []  # B recorded none
    assert drawn(page, "val-accuracy")[A]["xs"] == [5, 10, 15, 20]
    page.wait_for_selector(f"#cmp-train-accuracy[data-points-{A}='20']")

    page.goto(f"{static_url}/#/compare?jobs={B},{C}")
    page.wait_for_selector("#compare[data-state=done]")
    assert page.get_attribute("#cmp-accuracy", "data-state") == "empty"
    assert page.inner_text("#cmp-no-accuracy") == "no accuracy recorded for these runs"
    assert page.locator("#cmp-train-accuracy").is_hidden()
    assert log.errors() == [], log.messages


def test_hyperparameters_side_by_side_with_differences_highlighted(new_page: Any, static_url: str) -> None:
    page, log, _ = open_compare(new_page, static_url, [A, B, C])
    table = page.locator("#cmp-hparams")
    head = table.locator("thead th").all_inner_texts()
    assert [h.strip() for h in head] == ["setting", "alpha · c0ffee", "beta · beef02", "gamma · cafe03"]
    differing = table.locator("tr[data-differs=true]").evaluate_all("rs => rs.map((r) => r.dataset.param)")
    assert differing == ["seed", "suffix", "train.learning_rate"]
    row = table.locator("tr[data-param='train.learning_rate'] td").all_inner_texts()
    assert row == ["0.001", "0.0005", "0.001"]
    assert table.locator("tr[data-param='train.export_formats'] td").all_inner_texts() == ["gguf, hf"] * 3
    assert table.locator("tr[data-param='model.n_embd']").get_attribute("data-differs") == "false"
    assert page.inner_text("#cmp-diff-count") == f"3 of {table.locator('tbody tr').count()} differ"
    # highlighted: the differing row's cells have a background of their own
    plain_bg = table.locator("tr[data-param='model'] td").first.evaluate(
        "c => getComputedStyle(c).backgroundColor"
    )
    diff_bg = table.locator("tr[data-param='seed'] td").first.evaluate(
        "c => getComputedStyle(c).backgroundColor"
    )
    assert plain_bg != diff_bg

    page.check("#cmp-only-diff")
    visible = [r for r in table.locator("tbody tr").all() if r.is_visible()]
    assert [r.get_attribute("data-param") for r in visible] == differing
    assert log.errors() == [], log.messages


def test_settings_left_auto_show_what_the_worker_decided(new_page: Any, static_url: str) -> None:
    """From a run's start event (the trainer's decisions); a run without one shows plain auto."""
    page, log = new_page()
    api = StubApi(page)
    jobs = StubJobs(api)
    auto = {**TRAIN, "dtype": "auto", "dropout": None, "eval_every": None}
    start = {
        "id": "ftevent-start", "object": "fine_tuning.job.event", "created_at": 1_700_000_002, "level": "info",
        "type": "message", "message": "Training on cpu in bfloat16: ...",
        "data": {"dtype": "bfloat16", "compile": False, "auto": ["dropout 0.1: auto: 2 passes", "eval_every 5: auto: 4"]},
    }  # fmt: skip
    jobs.add(job_object(A, suffix="alpha", train=auto, architecture=ARCH), POINTS_A, [start])
    jobs.add(job_object(B, suffix="beta", train=auto, architecture=ARCH), POINTS_B)
    sign_in_with_stub(page, static_url, f"#/compare?jobs={A},{B}")
    page.wait_for_selector("#cmp-hparams tr[data-param='train.dtype']")
    cells = {
        name: page.locator(f"#cmp-hparams tr[data-param='train.{name}'] td").all_inner_texts()
        for name in ("dtype", "dropout", "eval_every", "learning_rate")
    }
    assert cells == {
        "dtype": ["auto → bfloat16", "auto"],
        "dropout": ["auto → 0.1", "null"],
        "eval_every": ["auto → 5", "null"],
        "learning_rate": ["0.001", "0.001"],
    }
    assert log.errors() == [], log.messages


def test_a_live_run_is_polled_until_it_ends(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    api, jobs = stub(page)
    running = job_object(A, status="running", suffix="alpha", step=10, total_steps=20, train=TRAIN)
    running["finished_at"] = None
    jobs.add(running, POINTS_A[:10])
    sign_in_with_stub(page, static_url, f"#/compare?jobs={A},{B}")
    page.wait_for_selector(f"#cmp-train-loss[data-points-{A}='10']")
    assert page.get_attribute("#compare", "data-state") == "loaded"  # still following A

    jobs.points[A] = POINTS_A  # the worker went on and finished
    jobs.jobs[A] = job_object(A, suffix="alpha", step=20, total_steps=20, train=TRAIN)
    page.wait_for_selector("#compare[data-state=done]")
    page.wait_for_selector(f"#cmp-train-loss[data-points-{A}='20']")
    assert drawn(page, "train-loss")[A]["xs"] == list(range(1, 21))
    assert page.locator(f"#cmp-runs tr[data-job-id='{A}'] .badge").inner_text() == "succeeded"
    assert api.calls[f"GET /fine_tuning/jobs/{B}/metrics"] == 1  # the finished run is read once
    assert log.errors() == [], log.messages


def test_jobs_ticked_in_the_list_open_together(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    stub(page)
    sign_in_with_stub(page, static_url)
    page.wait_for_selector(f".job-card[data-job-id='{A}']")
    compare = page.locator("#compare-selected")
    assert compare.is_disabled()
    page.get_by_label(f"Compare {B}").check()
    assert compare.is_disabled() and compare.inner_text() == "Compare 1"  # one run is no comparison
    page.get_by_label(f"Compare {A}").check()
    assert compare.inner_text() == "Compare 2"
    compare.click()
    page.wait_for_selector("#compare[data-state=done]")
    assert page.evaluate("decodeURIComponent(location.hash)") == f"#/compare?jobs={B},{A}"
    assert page.locator("#cmp-runs tbody tr").count() == 2

    # the runs can be chosen again on the compare page; a run can be taken out
    page.click("#cmp-choose")
    assert page.is_checked(f"#cmp-pick-{A}") and page.is_checked(f"#cmp-pick-{B}")
    page.check(f"#cmp-pick-{C}")
    page.click("#cmp-pick-go")
    page.wait_for_function("location.hash.split(',').length === 3")
    page.wait_for_selector("#compare[data-state=done]")
    page.get_by_role("button", name="Remove beta · beef02 from the comparison").click()
    page.wait_for_function(f"decodeURIComponent(location.hash) === '#/compare?jobs={A},{C}'")

    # the nav's Compare without runs: the picker alone
    page.click("#nav a[data-route=compare]")
    page.wait_for_selector("#cmp-pick-list[aria-busy=false]")
    assert page.locator("#cmp-runs").count() == 0
    assert page.locator("#cmp-pick-list li").count() == 3
    assert page.is_disabled("#cmp-pick-go")
    page.click("#nav a[data-route=jobs]")
    page.wait_for_selector(f".job-card[data-job-id='{A}'] input.pick-box:checked")  # ticks kept this session
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "jobs_compare_pick.png"))
    assert log.errors() == [], log.messages


def test_unknown_jobs_and_too_many(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    stub(page)
    missing = "ftjob-" + "0" * 24
    sign_in_with_stub(page, static_url, f"#/compare?jobs={A},{missing},{A}")
    page.wait_for_selector("#compare[data-state=done]")
    rows = page.locator("#cmp-runs tbody tr")
    assert rows.count() == 2  # the repeated id once
    assert "no such job" in rows.nth(1).inner_text()
    assert set(drawn(page, "train-loss")) == {A}  # the others still drawn
    assert page.locator("#cmp-hparams thead th").count() == 2  # setting + A

    ten = [f"ftjob-{i:024x}" for i in range(10)]
    page.goto(f"{static_url}/#/compare?jobs={','.join(ten)}")
    page.wait_for_selector("#compare[data-state=done]")
    assert page.inner_text(".compare .notice") == "Showing the first 8 of the 10 jobs asked for."
    assert page.locator("#cmp-runs tbody tr").count() == 8
    assert log.errors(allow=("404 (Not Found)",)) == [], log.messages


def test_screenshots_light_and_dark(new_page: Any, static_url: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        page, log, _ = open_compare(new_page, static_url, [A, B, C])
        page.emulate_media(color_scheme=scheme)
        set_smoothing(page, 0.6)
        painted(page)
        box = page.locator("#cmp-train-loss").bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.55, box["y"] + box["height"] * 0.4)
        page.wait_for_selector("#cmp-train-loss[data-readout]")
        suffix = "" if scheme == "light" else "_dark"
        page.screenshot(path=str(ARTIFACTS / f"compare_stub{suffix}.png"), full_page=True)
        assert log.errors() == [], log.messages
    # a phone: nothing wider than the screen (the tables scroll inside their card)
    page.set_viewport_size({"width": 390, "height": 844})
    painted(page)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.screenshot(path=str(ARTIFACTS / "compare_stub_phone.png"), full_page=True)


def test_training_dynamics_and_system_groups(new_page: Any, static_url: str) -> None:
    page, log, _ = open_compare(new_page, static_url, [A, B])
    assert page.get_attribute("#cmp-dynamics", "data-state") == "charts"
    for key, field in (("lr", "lr"), ("grad-norm", "grad_norm"), ("tokens-per-s", "tokens_per_s")):
        runs = drawn(page, key)
        assert runs[A]["raw"] == [p[field] for p in POINTS_A] and len(runs[B]["xs"]) == len(POINTS_B), key
    # no run recorded system metrics: the group says so instead of four empty charts
    assert page.get_attribute("#cmp-system", "data-state") == "empty"
    assert page.inner_text("#cmp-no-system") == "no system metrics recorded for these runs"
    assert log.errors() == [], log.messages
