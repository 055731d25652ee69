"""The job page's live-data state machine (views/job/live.js) in a real Chromium against a stubbed
API: where the stream resumes, and the polling fallback when the stream is down."""

from __future__ import annotations

from typing import Any

from tests.dashboard.stub_api import StubApi, error, sign_in_with_stub

JOB_ID = "ftjob-stub"
TOTAL = 10
PER_PAGE = 3  # points the stub gives per metrics request


def test_stream_resumes_after_the_last_step_drawn(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    page.goto(static_url + "/")
    result = page.evaluate("""async () => {
        const { LiveFeed } = await import('/js/views/job/live.js');
        const metrics = { lastStep: -1 };
        const feed = new LiveFeed({ id: 'x', metrics });
        const out = [feed.resumeFrom()];          // nothing drawn yet: from the start
        metrics.lastStep = 12;
        out.push(feed.resumeFrom());             // the history drew up to 12: 12 again (it may change)
        feed.lastEventId = '12.3';
        out.push(feed.resumeFrom());             // the stream's own id (what it sent is final)
        metrics.lastStep = 20;
        out.push(feed.resumeFrom());             // a poll drew up to 20 since: 20 again
        return out;
    }""")
    assert result == [None, "11.0", "12.3", "19.3"]
    assert log.errors() == []


class StubJob:
    """A job that reaches step TOTAL, PER_PAGE steps per metrics request, then succeeds."""

    def __init__(self) -> None:
        self.served = 0  # the last step handed out

    def points(self, after: int) -> list[dict[str, Any]]:
        steps = range(after + 1, min(after + PER_PAGE, TOTAL) + 1)
        self.served = max(self.served, *steps) if steps else self.served
        return [
            {
                "step": s,
                "train_loss": 5.0 - s / 10,
                "lr": 1e-3,
                "val_loss": None,
                "created_at": 1_700_000_000 + s,
            }
            for s in steps
        ]

    def metrics(self, query: dict[str, str], _: Any) -> tuple[int, Any]:
        after = int(query.get("after_step", 0))
        return 200, {"object": "list", "data": self.points(after), "has_more": False}

    def job(self, _query: dict[str, str], _body: Any) -> tuple[int, Any]:
        done = self.served >= TOTAL
        return 200, {
            "id": JOB_ID,
            "object": "fine_tuning.job",
            "model": "llama-tiny",
            "status": "succeeded" if done else "running",
            "created_at": 1_700_000_000,
            "progress": {"step": self.served, "total_steps": TOTAL},
        }


def test_polls_while_the_stream_is_down_until_the_job_ends(new_page: Any, static_url: str) -> None:
    page, log = new_page()
    api = StubApi(page)
    job = StubJob()
    base = f"/fine_tuning/jobs/{JOB_ID}"
    api.on("GET", base, job.job)
    api.on("GET", f"{base}/metrics", job.metrics)
    api.on("GET", f"{base}/stream", error(503, "stream unavailable"))
    api.on(
        "GET", f"{base}/checkpoints", lambda q, b: (200, {"object": "list", "data": [], "has_more": False})
    )
    api.on("GET", f"{base}/events", lambda q, b: (200, {"object": "list", "data": [], "has_more": False}))
    sign_in_with_stub(page, static_url, f"#/jobs/{JOB_ID}")
    page.wait_for_selector("#live-mode", state="attached")
    page.evaluate("""() => {
        const mode = document.getElementById('live-mode');
        window.__modes = [mode.dataset.mode];
        new MutationObserver(() => window.__modes.push(mode.dataset.mode))
            .observe(mode, { attributes: true, attributeFilter: ['data-mode'] });
    }""")
    page.wait_for_selector(".status-slot .badge[data-status=succeeded]", timeout=30_000)
    page.wait_for_selector("#live-mode[data-mode=done]", state="attached")
    modes = page.evaluate("window.__modes")
    assert "polling" in modes and modes[-1] == "done", modes
    assert page.get_attribute("#loss-chart", "data-points-train-loss") == str(TOTAL)
    assert page.inner_text("#stat-step") == f"{TOTAL} / {TOTAL}"
    assert api.calls[f"GET {base}/stream"] >= 1
    assert log.errors(allow=("503 (Service Unavailable)",)) == [], log.messages


def test_a_pause_asked_for_shows_until_it_is_done(new_page: Any, static_url: str) -> None:
    """A pause waits for the step in progress (a compile can take minutes) and its checkpoint: the
    button says so and stays disabled, the header says "pausing…", and a paused job's ETA reads
    "paused" instead of counting down."""
    page, log = new_page()
    page.goto(static_url + "/")
    result = page.evaluate("""async () => {
        const { jobActions } = await import('/js/views/job/actions.js');
        const { jobHeader } = await import('/js/views/job/header.js');
        const { progressCard } = await import('/js/views/job/progress.js');
        const statuses = { terminal: new Set(['succeeded', 'failed', 'cancelled']) };
        const actions = jobActions({ statuses, request: async () => {}, rerender: () => {} });
        const pause = actions.node.querySelector('#btn-pause');
        const resume = actions.node.querySelector('#btn-resume');
        const out = {};
        actions.render({ status: 'running', pause_requested: true });
        out.pausing = [pause.disabled, pause.textContent, resume.disabled];
        actions.render({ status: 'running', pause_requested: false });
        out.running = [pause.disabled, pause.textContent];
        actions.render({ status: 'paused', pause_requested: false });
        out.paused = [pause.disabled, resume.disabled];

        const header = jobHeader('ftjob-x', document.createElement('div'));
        header.showJob({ status: 'running', pause_requested: true, model: 'llama-tiny', created_at: 1 });
        out.headerPausing = header.node.querySelector('#pausing')?.textContent ?? null;
        header.showJob({ status: 'running', pause_requested: false, model: 'llama-tiny', created_at: 1 });
        out.headerRunning = header.node.querySelector('#pausing')?.textContent ?? null;
        const waiting = header.node.querySelector('#waiting-for');
        header.showJob({ status: 'queued', model: 'llama-tiny', created_at: 1, waiting_for: 'no live worker' });
        out.waiting = [waiting.hidden, waiting.textContent];
        header.showJob({ status: 'running', model: 'llama-tiny', created_at: 1, waiting_for: null });
        out.waitingGone = waiting.hidden;

        const charts = { lastTrainLoss: () => null, lastValLoss: () => null, setTotalSteps: () => {} };
        const card = progressCard({ charts, metrics: { lastStep: -1, rate: 2 }, statuses });
        document.body.append(card.node);
        const eta = () => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(
            () => done(card.node.querySelector('#stat-eta').textContent))));
        const job = (status) => ({ status, trained_tokens: 0,
            progress: { step: 5, total_steps: 10, eta_seconds: 100 } });
        card.update(job('paused'));
        out.etaPaused = await eta();
        card.update(job('running'));
        out.etaRunning = await eta();
        return out;
    }""")
    assert result["pausing"] == [True, "Pausing…", True]
    assert result["running"] == [False, "Pause"]
    assert result["paused"] == [True, False]
    assert result["headerPausing"] == " pausing…" and result["headerRunning"] is None
    assert result["waiting"] == [False, "Waiting: no live worker"] and result["waitingGone"] is True
    assert result["etaPaused"] == "paused" and result["etaRunning"] not in ("paused", "—", "done")
    assert log.errors() == []
