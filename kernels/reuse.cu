// Kamera reuse kernels (compiled at run time by NVRTC; no CUDA headers needed).
// Fused relocate + patch (shared/KAMERA.md "The operator"): for one channel of one layer,
//   dst[t] = R(δ) · (src[t] + Σ_j P[t, j] · Wᵀ[j, :])
// with R(δ) one rotation per rotary pair (the same for every token: a chunk shift turns pair i
// by δ·θ_i, M-RoPE included), applied to the first `rotary_dims` dims of each of `n_heads` heads,
// pairs (2i, 2i+1) when `interleaved`, else (i, i + rotary_dims/2). `rotate == 0` skips R (V
// channels, the MLA latent). One block per token row; the row is staged in shared memory.
// `*bad` is set when an output is NaN or infinite (the CPU reference's NonFinite error).
// CPU reference: kamera-ops reuse_into.

typedef unsigned short u16;

__device__ __forceinline__ float load_f(const float* p, long i) { return p[i]; }
__device__ __forceinline__ float load_h(const u16* p, long i) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }\n" : "=f"(f) : "h"(p[i]));
    return f;
}
__device__ __forceinline__ float load_b(const u16* p, long i) {
    return __uint_as_float(((unsigned int)p[i]) << 16);
}
__device__ __forceinline__ void store_f(float* p, long i, float x) { p[i] = x; }
__device__ __forceinline__ void store_h(u16* p, long i, float x) {
    u16 h;
    asm("{ cvt.rn.f16.f32 %0, %1; }\n" : "=h"(h) : "f"(x));
    p[i] = h;
}
// Round to nearest even, as the `half` crate does; NaN stays NaN.
__device__ __forceinline__ void store_b(u16* p, long i, float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        p[i] = (u16)((u >> 16) | 0x0040u);
        return;
    }
    unsigned int round = 0x7fffu + ((u >> 16) & 1u);
    p[i] = (u16)((u + round) >> 16);
}

#define REUSE_KERNEL(NAME, TI, LOAD, TO, STORE)                                                       \
extern "C" __global__ void NAME(                                                                      \
    const TI* __restrict__ src, TO* __restrict__ dst, int n, int cols,                                \
    const float* __restrict__ p, const float* __restrict__ wt, int rank,                              \
    const float* __restrict__ cosv, const float* __restrict__ sinv, int rotate,                       \
    int n_heads, int head_dim, int rotary_dims, int interleaved, int* bad) {                           \
    extern __shared__ float smem[];                                                                   \
    float* row = smem;               /* cols */                                                      \
    float* coef = smem + cols;       /* rank */                                                      \
    for (int t = blockIdx.x; t < n; t += gridDim.x) {                                                 \
        const long base = (long)t * cols;                                                             \
        for (int j = threadIdx.x; j < rank; j += blockDim.x) coef[j] = p[(long)t * rank + j];         \
        __syncthreads();                                                                              \
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {                                        \
            float x = LOAD(src, base + c);                                                            \
            for (int j = 0; j < rank; ++j) x += coef[j] * wt[(long)j * cols + c];                     \
            row[c] = x;                                                                               \
        }                                                                                             \
        __syncthreads();                                                                              \
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {                                        \
            float y = row[c];                                                                         \
            int h = c / head_dim, d = c - h * head_dim;                                               \
            if (rotate && h < n_heads && d < rotary_dims) {                                           \
                int half = rotary_dims >> 1, i, partner; float sign;                                  \
                if (interleaved) { i = d >> 1; partner = d ^ 1; sign = (d & 1) ? 1.f : -1.f; }        \
                else if (d < half) { i = d; partner = d + half; sign = -1.f; }                        \
                else { i = d - half; partner = d - half; sign = 1.f; }                                \
                float other = row[h * head_dim + partner];                                            \
                y = y * cosv[i] + sign * other * sinv[i];                                             \
            }                                                                                         \
            if ((__float_as_uint(y) & 0x7f800000u) == 0x7f800000u) *bad = 1;                          \
            STORE(dst, base + c, y);                                                                  \
        }                                                                                             \
        __syncthreads();                                                                              \
    }                                                                                                 \
}

REUSE_KERNEL(reuse_f32_f32, float, load_f, float, store_f)
REUSE_KERNEL(reuse_f32_f16, float, load_f, u16, store_h)
REUSE_KERNEL(reuse_f32_bf16, float, load_f, u16, store_b)
REUSE_KERNEL(reuse_f16_f32, u16, load_h, float, store_f)
REUSE_KERNEL(reuse_f16_f16, u16, load_h, u16, store_h)
REUSE_KERNEL(reuse_f16_bf16, u16, load_h, u16, store_b)
REUSE_KERNEL(reuse_bf16_f32, u16, load_b, float, store_f)
REUSE_KERNEL(reuse_bf16_f16, u16, load_b, u16, store_h)
REUSE_KERNEL(reuse_bf16_bf16, u16, load_b, u16, store_b)
