"""The job page's charts (issue 24 part 4) in a real Chromium against a stubbed API: the x axis by
step, tokens or wall-clock time, the training-dynamics charts (learning rate, gradient norm,
tokens/s) and the system charts (CPU and device use, memory) the worker's samples fill, the sparse
validation series drawn as its raw points, and the last x label of a 2,000-step axis drawn whole
(it was cut to "2,00"). Screenshot: tests/artifacts/job_charts.png (look at it)."""

from __future__ import annotations

from typing import Any

from tests.dashboard.conftest import ARTIFACTS
from tests.dashboard.stub_api import StubApi, StubJobs, job_object, ok, sign_in_with_stub

JOB_ID = "ftjob-charts"
TOTAL = 2000
EMPTY = {"object": "list", "data": [], "has_more": False}


def points() -> list[dict[str, Any]]:
    out = []
    for step in range(20, TOTAL + 1, 20):
        out.append({
            "step": step, "train_loss": 4 - step / 1000, "val_loss": 4.1 - step / 1000 if step % 500 == 0 else None,
            "lr": 1e-3, "grad_norm": 1 + step / 2000, "tokens_per_s": 5000.0, "tokens_seen": step * 4096,
            "peak_memory_bytes": 3e8, "cpu_percent": 180.0, "rss_bytes": 2.5e8, "gpu_utilization": None,
            "gpu_memory_bytes": None, "created_at": 1_700_000_000 + step * 0.9,
        })  # fmt: skip
    return out


def open_charts(new_page: Any, static_url: str) -> tuple[Any, Any]:
    page, log = new_page()
    api = StubApi(page)
    job = job_object(JOB_ID, step=TOTAL, total_steps=TOTAL)
    StubJobs(api).add(job, points())
    base = f"/fine_tuning/jobs/{JOB_ID}"
    for path in ("checkpoints", "events"):
        api.on("GET", f"{base}/{path}", ok(EMPTY))
    page.goto(static_url + "/")
    page.evaluate("localStorage.removeItem('fromscratch.xAxis')")
    sign_in_with_stub(page, static_url, f"#/jobs/{JOB_ID}")
    page.wait_for_selector(f"#loss-chart[data-points-train-loss='{TOTAL // 20}']")
    return page, log


def painted(page: Any) -> None:
    page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")


def test_dynamics_and_system_charts_and_the_sparse_val_series(new_page: Any, static_url: str) -> None:
    page, log = open_charts(new_page, static_url)
    painted(page)
    n = str(TOTAL // 20)
    assert page.get_attribute("#grad-norm-chart", "data-points") == n
    assert page.get_attribute("#tps-chart", "data-points") == n
    assert page.get_attribute("#cpu-chart", "data-points-process-cpu") == n
    assert page.get_attribute("#cpu-chart", "data-points-device-utilization") == "0"  # a CPU run: none
    assert page.get_attribute("#memory-chart", "data-points-process-rss") == n
    assert page.get_attribute("#memory-chart", "data-points-peak-memory") == n
    # the validation series: its 4 evaluations as they are (the job page never smooths)
    assert page.get_attribute("#loss-chart", "data-points-val-loss") == "4"
    # the step axis reaches 2,000 and its last label fits inside the canvas
    ticks = page.get_attribute("#loss-chart", "data-x-ticks").split("|")
    assert ticks[-1] == "2,000", ticks
    for chart in ("loss-chart", "lr-chart", "grad-norm-chart", "tps-chart", "cpu-chart", "memory-chart"):
        assert page.get_attribute(f"#{chart}", "data-x-labels-fit") == "true", chart
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "job_charts.png"), full_page=True)
    assert log.errors() == [], log.messages


def test_x_axis_by_tokens_and_wall_clock_time(new_page: Any, static_url: str) -> None:
    page, log = open_charts(new_page, static_url)
    page.select_option("#x-axis", "time")
    painted(page)
    ticks = page.get_attribute("#loss-chart", "data-x-ticks").split("|")
    # 1,782 s from the first point to the last: minutes on the axis, starting at 0
    assert ticks[0] == "0s" and all(t.endswith("m") or t.endswith("s") for t in ticks), ticks
    assert page.get_attribute("#loss-chart", "data-points-val-loss") == "4"
    box = page.locator("#loss-chart").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    page.wait_for_selector("#loss-chart[data-readout^='wall-clock time ']")
    page.mouse.move(0, 0)

    page.select_option("#x-axis", "tokens_seen")
    painted(page)
    ticks = page.get_attribute("#loss-chart", "data-x-ticks").split("|")
    assert ticks[-1].endswith("M"), ticks  # 8.2M tokens at the end
    assert page.get_attribute("#lr-chart", "data-x-labels-fit") == "true"
    # the choice is remembered for the next page
    page.reload()
    page.wait_for_selector(f"#loss-chart[data-points-train-loss='{TOTAL // 20}']")
    assert page.input_value("#x-axis") == "tokens_seen"
    assert log.errors() == [], log.messages
