"""The dashboard's own code in a real Chromium, served as plain static files (no API needed):
the page loads clean, the chart keeps bounded arrays, the SSE parser, the chart draws."""

from __future__ import annotations

from typing import Any


def test_sign_in_page_loads_without_console_errors(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    page.goto(static_url + "/")
    page.wait_for_selector("#api-key")
    assert page.locator("label[for=api-key]").inner_text() == "API key"
    assert page.evaluate("document.activeElement.id") == "api-key"  # keyboard users start typing at once
    assert page.locator("#nav").is_hidden()
    assert log.errors() == []


def test_series_stays_bounded_keeps_spikes_first_and_last(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    page.goto(static_url + "/")
    result = page.evaluate("""async () => {
        const { Series } = await import('/js/chart.js');
        const s = new Series({ name: 'train', color: '#000', max: 2000 });
        for (let step = 1; step <= 100000; step++) s.push(step, step === 54321 ? 99 : 3 + Math.sin(step));
        let increasing = true;
        for (let i = 1; i < s.xs.length; i++) if (!(s.xs[i] > s.xs[i - 1])) increasing = false;
        return { n: s.length, first: s.xs[0], last: s.lastX, max: Math.max(...s.ys), increasing };
    }""")
    assert result["n"] <= 2000 and result["n"] >= 1000
    assert result["first"] == 1 and result["last"] == 100000
    assert result["max"] == 99  # the spike survived every decimation
    assert result["increasing"]
    assert log.errors() == []


def test_series_replaces_the_tail_when_a_resumed_job_repeats_steps(new_page: Any, static_url: str) -> None:
    page, _ = new_page()
    page.goto(static_url + "/")
    xs = page.evaluate("""async () => {
        const { Series } = await import('/js/chart.js');
        const s = new Series({ name: 'train', color: '#000' });
        for (let step = 1; step <= 30; step++) s.push(step, 5);
        for (let step = 21; step <= 25; step++) s.push(step, 4);  // resumed from the step-20 checkpoint
        s.push(26, NaN);  // not drawable: ignored
        return s.xs;
    }""")
    assert xs == list(range(1, 26))


def test_sse_parser_matches_the_spec_on_any_chunking(new_page: Any, static_url: str) -> None:
    page, _ = new_page()
    page.goto(static_url + "/")
    result = page.evaluate("""async () => {
        const { SSEParser } = await import('/js/api.js');
        const text = 'retry: 2000\\r\\n\\r\\n: keep-alive\\r\\n\\r\\nevent: metrics\\r\\nid: 7.0\\r\\n'
          + 'data: {"step": 7}\\r\\n\\r\\nevent: status\\nid: 7.2\\ndata: a\\ndata: b\\n\\n';
        const outs = new Set();
        let lastId = null;
        for (let cut = 1; cut < text.length; cut++) {
            const p = new SSEParser();
            const evs = [...p.feed(text.slice(0, cut)), ...p.feed(text.slice(cut))];
            outs.add(JSON.stringify(evs));
            lastId = p.lastEventId;
        }
        return { outs: [...outs], lastId };
    }""")
    assert len(result["outs"]) == 1
    import json

    assert json.loads(result["outs"][0]) == [
        {"event": "metrics", "data": '{"step": 7}', "id": "7.0"},
        {"event": "status", "data": "a\nb", "id": "7.2"},
    ]
    assert result["lastId"] == "7.2"


def test_chart_draws_lines_and_reports_its_points(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    page.goto(static_url + "/")
    result = page.evaluate("""async () => {
        const { LineChart, Series } = await import('/js/chart.js');
        document.body.innerHTML = '<canvas id="c" style="width:600px;height:300px;display:block"></canvas>';
        const canvas = document.getElementById('c');
        const train = new Series({ name: 'train loss', color: 'rgb(255, 0, 0)' });
        const val = new Series({ name: 'val loss', color: 'rgb(0, 0, 255)', markers: true });
        for (let s = 1; s <= 60; s++) train.push(s, 5 * Math.exp(-s / 20) + 1);
        for (let s = 10; s <= 60; s += 10) val.push(s, 5 * Math.exp(-s / 20) + 1.2);
        const chart = new LineChart(canvas, [train, val], { yLabel: 'loss', log: true });
        await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
        const px = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        let red = 0, blue = 0;
        for (let i = 0; i < px.length; i += 4) {
            if (px[i] > 200 && px[i + 1] < 80 && px[i + 2] < 80) red++;
            if (px[i + 2] > 200 && px[i] < 80 && px[i + 1] < 80) blue++;
        }
        chart.destroy();
        return { points: canvas.dataset.points, train: canvas.getAttribute('data-points-train-loss'), red, blue,
                 label: canvas.getAttribute('aria-label') };
    }""")
    assert result["points"] == "66" and result["train"] == "60"
    assert result["red"] > 200 and result["blue"] > 20  # both curves are on the canvas
    assert "train loss" in result["label"] and "step 60" in result["label"]
    assert log.errors() == []


def test_chart_of_a_flat_curve_draws_without_errors(new_page: Any, static_url: str) -> None:
    # Two readings one float resolution apart: the tick loop used to step by nothing and grow its
    # array until the page threw "Invalid array length" (seen live when two runs' curves met).
    page, log = new_page()
    page.goto(static_url + "/")
    result = page.evaluate("""async () => {
        const { LineChart, Series } = await import('/js/chart.js');
        document.body.innerHTML = '<canvas id="c" style="width:600px;height:300px;display:block"></canvas>';
        const canvas = document.getElementById('c');
        const flat = new Series({ name: 'acc', color: 'rgb(255, 0, 0)' });
        flat.push(1, 0.5);
        flat.push(2, 0.5 + Number.EPSILON / 2);
        const charts = [new LineChart(canvas, [flat], { yLabel: 'acc' }),
                        new LineChart(canvas, [flat], { yLabel: 'acc', log: true })];
        await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
        charts.forEach((c) => c.destroy());
        return canvas.dataset.points;
    }""")
    assert result == "2"
    assert log.errors() == [], log.messages
