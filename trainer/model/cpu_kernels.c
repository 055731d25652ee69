/* Fused CPU kernels for the element-wise parts of a training step: RMSNorm, the q/k/v split with
 * RoPE, SwiGLU, forward and backward, float32 only. Each reads its inputs and writes its outputs
 * once, where torch's eager ops make 3 to 9 passes over memory for the same result (see
 * trainer/model/cpu_kernels.py, which compiles this file and calls it through ctypes).
 *
 * Built with -O3 -march=native -ffast-math -fopenmp: the loops vectorize (expf through glibc's
 * libmvec) and run on `threads` OpenMP threads, the runtime torch itself loaded. Rows are split
 * statically, and the one reduction across rows (RMSNorm's weight gradient) sums fixed row blocks
 * in a fixed order, so results do not depend on timing or the thread count. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define WEIGHT_GRAD_BLOCKS 16 /* rows of rmsnorm_bwd are cut in this many blocks, summed in order */

/* sigmoid(x) from e = exp(-|x|), which lies in (0, 1]: no overflow to inf for any x (fast-math code
 * must not meet an inf: 1 / (1 + exp(100)) came out NaN) */
static inline float sigmoid(float x) {
    float e = expf(-fabsf(x));
    return (x >= 0.f ? 1.f : e) / (1.f + e);
}

/* y = x / rms(x) * w for each row of x (n x c); rstd[i] = 1 / rms(x_i) */
void rmsnorm_fwd(const float *x, const float *w, float *y, float *rstd, int64_t n, int64_t c, float eps,
                 int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + i * c;
        float *yr = y + i * c;
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < c; j++) ss += xr[j] * xr[j];
        float r = 1.f / sqrtf(ss / (float)c + eps);
        rstd[i] = r;
#pragma omp simd
        for (int64_t j = 0; j < c; j++) yr[j] = xr[j] * r * w[j];
    }
}

/* With xhat = x * r: dx = r * (g w - xhat * mean(g w xhat)) per row; dw = sum over rows of g xhat.
 * partial: WEIGHT_GRAD_BLOCKS x c floats of scratch. */
void rmsnorm_bwd(const float *g, const float *x, const float *w, const float *rstd, float *dx, float *dw,
                 float *partial, int64_t n, int64_t c, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int p = 0; p < WEIGHT_GRAD_BLOCKS; p++) {
        float *acc = partial + p * c;
        memset(acc, 0, sizeof(float) * c);
        for (int64_t i = n * p / WEIGHT_GRAD_BLOCKS; i < n * (p + 1) / WEIGHT_GRAD_BLOCKS; i++) {
            const float *gr = g + i * c, *xr = x + i * c;
            float *dr = dx + i * c;
            float r = rstd[i], dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t j = 0; j < c; j++) dot += gr[j] * w[j] * xr[j];
            dot = dot * r / (float)c; /* mean(g w xhat) */
#pragma omp simd
            for (int64_t j = 0; j < c; j++) {
                float xh = xr[j] * r;
                acc[j] += gr[j] * xh;
                dr[j] = r * (gr[j] * w[j] - xh * dot);
            }
        }
    }
    for (int64_t j = 0; j < c; j++) {
        float s = 0.f;
        for (int p = 0; p < WEIGHT_GRAD_BLOCKS; p++) s += partial[p * c + j];
        dw[j] = s;
    }
}

/* out = silu(gate) * up, where each row of h (n x 2m) is [gate | up] */
void swiglu_fwd(const float *h, float *out, int64_t n, int64_t m, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n; i++) {
        const float *gate = h + i * 2 * m, *up = gate + m;
        float *o = out + i * m;
#pragma omp simd
        for (int64_t j = 0; j < m; j++) o[j] = gate[j] * sigmoid(gate[j]) * up[j];
    }
}

/* dh = [d gate | d up] from the output gradient, recomputing sigmoid(gate) rather than storing it:
 * d up = grad * silu(gate), d gate = grad * up * s * (1 + gate * (1 - s)) with s = sigmoid(gate) */
void swiglu_bwd(const float *grad, const float *h, float *dh, int64_t n, int64_t m, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n; i++) {
        const float *gate = h + i * 2 * m, *up = gate + m, *d = grad + i * m;
        float *d_gate = dh + i * 2 * m, *d_up = d_gate + m;
#pragma omp simd
        for (int64_t j = 0; j < m; j++) {
            float x = gate[j], s = sigmoid(x);
            d_up[j] = d[j] * x * s;
            d_gate[j] = d[j] * up[j] * s * (1.f + x * (1.f - s));
        }
    }
}

/* One head vector of hd floats turned by RoPE in the rotate_half layout over its first n_rot dims
 * (dim j pairs with j + n_rot/2); the rest is copied. sign -1 turns back (the backward). */
static inline void rotate(const float *x, float *o, const float *cos, const float *sin, int64_t hd,
                          int64_t n_rot, float sign) {
    int64_t half = n_rot / 2;
#pragma omp simd
    for (int64_t j = 0; j < half; j++) {
        float a = x[j], b = x[j + half], c = cos[j], s = sign * sin[j];
        o[j] = a * c - b * s;
        o[j + half] = b * c + a * s;
    }
    for (int64_t j = n_rot; j < hd; j++) o[j] = x[j];
}

/* qkv (B, T, H + 2 KV, hd) -> q (B, H, T, hd) and k, v (B, KV, T, hd), q and k rotated;
 * cos/sin: (T, n_rot) tables */
void qkv_fwd(const float *qkv, const float *cos, const float *sin, float *q, float *k, float *v, int64_t B,
             int64_t T, int64_t H, int64_t KV, int64_t hd, int64_t n_rot, int threads) {
    int64_t heads = H + 2 * KV;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t b = bt / T, t = bt % T;
        const float *row = qkv + bt * heads * hd, *c = cos + t * n_rot, *s = sin + t * n_rot;
        for (int64_t h = 0; h < H; h++) rotate(row + h * hd, q + ((b * H + h) * T + t) * hd, c, s, hd, n_rot, 1.f);
        for (int64_t h = 0; h < KV; h++) {
            rotate(row + (H + h) * hd, k + ((b * KV + h) * T + t) * hd, c, s, hd, n_rot, 1.f);
            memcpy(v + ((b * KV + h) * T + t) * hd, row + (H + KV + h) * hd, sizeof(float) * hd);
        }
    }
}

/* The gradients of q, k, v (layouts as qkv_fwd's outputs) -> the gradient of qkv, q and k turned back */
void qkv_bwd(const float *dq, const float *dk, const float *dv, const float *cos, const float *sin, float *grad,
             int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, int64_t n_rot, int threads) {
    int64_t heads = H + 2 * KV;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t b = bt / T, t = bt % T;
        float *row = grad + bt * heads * hd;
        const float *c = cos + t * n_rot, *s = sin + t * n_rot;
        for (int64_t h = 0; h < H; h++) rotate(dq + ((b * H + h) * T + t) * hd, row + h * hd, c, s, hd, n_rot, -1.f);
        for (int64_t h = 0; h < KV; h++) {
            rotate(dk + ((b * KV + h) * T + t) * hd, row + (H + h) * hd, c, s, hd, n_rot, -1.f);
            memcpy(row + (H + KV + h) * hd, dv + ((b * KV + h) * T + t) * hd, sizeof(float) * hd);
        }
    }
}
