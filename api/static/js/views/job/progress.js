// The progress card: bar, step, losses, tokens/s, ETA, trained tokens. Painted at most once per
// animation frame however many points arrive.

import { el, fmtDuration, fmtInt, fmtLoss, progressBar, setProgress } from "../../util.js";

// the ETA of a job that is not counting down: "succeeded" is the one ending with nothing left to
// do, a paused job waits for its resume; failed and cancelled jobs have none ("—")
const ENDED_ETA = { succeeded: "done", paused: "paused" };

function stat(label, key) {
  const dd = el("dd", { id: `stat-${key}` }, "—");
  return [el("div", { class: "stat" }, el("dt", {}, label), dd), dd];
}

/** charts: jobCharts(); metrics: LiveMetrics; statuses: the served status sets. */
export function progressCard({ charts, metrics, statuses }) {
  const [stepBox, stepDd] = stat("Step", "step");
  const [lossBox, lossDd] = stat("Train loss", "train-loss");
  const [valBox, valDd] = stat("Val loss", "val-loss");
  const [tpsBox, tpsDd] = stat("Tokens/s", "tokens-per-s");
  const [etaBox, etaDd] = stat("ETA", "eta");
  const [tokBox, tokDd] = stat("Trained tokens", "trained-tokens");
  const bar = progressBar(0, 0, "Training progress");
  const node = el("section", { class: "card progress-card", "aria-label": "Progress" }, bar,
    el("dl", { class: "stats" }, stepBox, lossBox, valBox, tpsBox, etaBox, tokBox));

  let job = null;
  let pending = false;
  let readAt = Date.now(); // when `job` was read: its eta_seconds counts down from then

  function paint() {
    if (!job) return;
    const p = job.progress || {};
    const total = p.total_steps || 0;
    const step = Math.max(p.step ?? 0, metrics.lastStep);
    setProgress(bar, step, total);
    stepDd.textContent = total ? `${fmtInt(step)} / ${fmtInt(total)}` : fmtInt(step >= 0 ? step : null);
    lossDd.textContent = fmtLoss(charts.lastTrainLoss() ?? p.train_loss);
    valDd.textContent = fmtLoss(charts.lastValLoss() ?? p.val_loss);
    // the server's smoothed rate (an average over recent steps without evaluation and checkpoint
    // pauses) and the ETA from it, counted down since the job was read; the last point's own rate
    // (one interval: it swings) only until the server has measured one
    tpsDd.textContent = fmtInt(p.tokens_per_s ?? metrics.tokensPerS);
    const live = !statuses.terminal.has(job.status) && job.status !== "paused"; // nothing counts down
    let eta = p.eta_seconds;
    if (live && eta != null) eta = Math.max(0, eta - (Date.now() - readAt) / 1000);
    else if (live && metrics.rate && total) eta = Math.max(0, (total - step) / metrics.rate);
    etaDd.textContent = live ? fmtDuration(eta) : ENDED_ETA[job.status] ?? "—";
    tokDd.textContent = fmtInt(job.trained_tokens);
    charts.setTotalSteps(total);
  }

  return {
    node,
    /** Repaint on the next frame, with `latest` as the job if given (else the last one seen). */
    update(latest) {
      if (latest) {
        job = latest;
        readAt = Date.now();
      }
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => { pending = false; paint(); });
    },
  };
}
