// What the page derives from the metrics points it has seen: the last step drawn, the latest
// tokens/s, and the steps-per-second rate behind the live ETA.

export class LiveMetrics {
  lastStep = -1;
  tokensPerS = undefined;
  rate = null; // steps per second over the points seen live
  #origin = null; // {t, step}: where the rate is measured from

  /** A point in step order; an earlier step than the last means a resumed job. */
  observe(m) {
    if (m.tokens_per_s != null) this.tokensPerS = m.tokens_per_s;
    if (typeof m.created_at === "number") {
      if (!this.#origin || m.step < this.#origin.step) this.#origin = { t: m.created_at, step: m.step };
      else if (m.created_at - this.#origin.t >= 1 && m.step > this.#origin.step) {
        this.rate = (m.step - this.#origin.step) / (m.created_at - this.#origin.t);
      }
    }
    this.lastStep = m.step;
  }

  /** History points may be decimated: measure the rate from the next live point on. */
  restartRate() { this.#origin = null; }
}
