// TensorBoard-style smoothing: an exponential moving average over the points in order, debiased so
// the first points are not pulled towards zero (the average starts at 0, so after n points it is
// scaled by 1 / (1 - weight^n)). Weight 0 leaves the curve as it is; 0.99 is very smooth.
// A sparse series (a validation curve of a few evaluations) is never smoothed: an average over 3-4
// points ends far from the last real value (1.92 drawn for a real 1.81), so it is drawn raw.

/** Below this many points a series is drawn as it is, whatever the smoothing weight. */
export const SMOOTH_MIN_POINTS = 10;

/** The weight a series of n points is smoothed with: 0 for a sparse one. */
export const weightFor = (n, weight) => (n < SMOOTH_MIN_POINTS ? 0 : weight);

/** The smoothed copy of ys (same length). A value that is not a finite number stays as it is and
 *  does not enter the average. */
export function ema(ys, weight) {
  const w = Math.min(Math.max(Number(weight) || 0, 0), 0.999);
  const out = new Array(ys.length);
  let avg = 0;
  let n = 0;
  for (let i = 0; i < ys.length; i++) {
    const y = ys[i];
    if (typeof y !== "number" || !Number.isFinite(y)) { out[i] = y; continue; }
    avg = avg * w + (1 - w) * y;
    n += 1;
    out[i] = w === 0 ? y : avg / (1 - Math.pow(w, n));
  }
  return out;
}
