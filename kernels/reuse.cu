// Kamera reuse kernels (compiled at run time by NVRTC; no CUDA headers needed).
// Fused relocate + patch (shared/KAMERA.md "The operator"): for one channel (K or V) of every
// layer of a chunk,
//   dst[layer, dst_row + t] = R_layer(δ) · (src[layer, t] + Σ_j P_layer[t, j] · Wᵀ_layer[j, :])
// R(δ) is one rotation per rotary pair, the same for every token (a chunk shift turns pair i by
// δ·θ_i; M-RoPE too), applied to the first `rotary_dims` dims of each of `n_heads` heads: pairs
// (2i, 2i+1) when `interleaved`, else (i, i + rotary_dims/2). `rotate == 0` skips R (V, the MLA
// latent). Writing at `dst_row` of a `dst_rows`-row buffer makes the same kernel the gather that
// assembles a context from several chunks. CPU reference: kamera-ops reuse_into.
//
// Three kernel families, picked by the host per launch: two-column units for any shape
// (reuse_*), four-column units where heads, rotary span and rows are multiples of 4 (reuse4_*),
// and those with a tensor-core patch for 16-bit factors (reuse4tc_*). In all, blockIdx.y is the
// layer and blockIdx.x a tile of tokens; a thread owns one unit of columns that a rotation mixes
// and keeps several rows of it in registers (many loads in flight).
// jobs[3·layer ..] = (offset of P_layer in p, offset of Wᵀ_layer in wt, rank of the layer).
// `*bad` is set when an output is NaN or infinite (the CPU reference's NonFinite error).

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;


__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }\n" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float x) {
    u16 h;
    asm("{ cvt.rn.f16.f32 %0, %1; }\n" : "=h"(h) : "f"(x));
    return h;
}
__device__ __forceinline__ float b2f(u16 b) { return __uint_as_float(((u32)b) << 16); }
// Round to nearest even, as the `half` crate does; NaN stays NaN.
__device__ __forceinline__ u16 f2b(float x) {
#if __CUDA_ARCH__ >= 800
    u16 h;
    asm("{ cvt.rn.bf16.f32 %0, %1; }\n" : "=h"(h) : "f"(x));
    return h;
#endif
    u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x0040u);
    return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// One element, and an adjacent even-aligned pair in one load/store (two-column kernels: a
// thread owns two columns and ROWS = 8 rows of them; the tile's P rows sit in shared memory).
__device__ __forceinline__ float load_f(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ float load_h(const u16* p, i64 i) { return h2f(p[i]); }
__device__ __forceinline__ float load_b(const u16* p, i64 i) { return b2f(p[i]); }
__device__ __forceinline__ float2 load2_f(const float* p, i64 i) { return *(const float2*)(p + i); }
__device__ __forceinline__ float2 load2_h(const u16* p, i64 i) {
    u32 w = *(const u32*)(p + i);
    return make_float2(h2f((u16)(w & 0xffffu)), h2f((u16)(w >> 16)));
}
__device__ __forceinline__ float2 load2_b(const u16* p, i64 i) {
    u32 w = *(const u32*)(p + i);
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ void store_f(float* p, i64 i, float x) { p[i] = x; }
__device__ __forceinline__ void store_h(u16* p, i64 i, float x) { p[i] = f2h(x); }
__device__ __forceinline__ void store_b(u16* p, i64 i, float x) { p[i] = f2b(x); }
// Two floats to packed 16-bit words, low element first: one instruction from sm_80 on, the
// software rounding (same bits for finite values) before.
__device__ __forceinline__ u32 pack_h(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    u32 d;
    asm("{ cvt.rn.f16x2.f32 %0, %1, %2; }\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
#else
    return (u32)f2h(lo) | ((u32)f2h(hi) << 16);
#endif
}
__device__ __forceinline__ u32 pack_b(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    u32 d;
    asm("{ cvt.rn.bf16x2.f32 %0, %1, %2; }\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
#else
    return (u32)f2b(lo) | ((u32)f2b(hi) << 16);
#endif
}
__device__ __forceinline__ void store2_f(float* p, i64 i, float a, float b) { *(float2*)(p + i) = make_float2(a, b); }
__device__ __forceinline__ void store2_h(u16* p, i64 i, float a, float b) { *(u32*)(p + i) = pack_h(a, b); }
__device__ __forceinline__ void store2_b(u16* p, i64 i, float a, float b) { *(u32*)(p + i) = pack_b(a, b); }
// Four adjacent, 4-element-aligned values in one store.
__device__ __forceinline__ void store4_f(float* p, i64 i, float4 x) { *(float4*)(p + i) = x; }
__device__ __forceinline__ void store4_h(u16* p, i64 i, float4 x) {
    *(uint2*)(p + i) = make_uint2(pack_h(x.x, x.y), pack_h(x.z, x.w));
}
__device__ __forceinline__ void store4_b(u16* p, i64 i, float4 x) {
    *(uint2*)(p + i) = make_uint2(pack_b(x.x, x.y), pack_b(x.z, x.w));
}
// Non-finite detection in one FMA per value: x·0 is 0 for finite x and NaN for ±inf or NaN, so
// the running sum stays 0 exactly when every value was finite.
__device__ __forceinline__ float taint(float acc, float x) { return fmaf(x, 0.f, acc); }
__device__ __forceinline__ float taint4(float acc, float4 x) {
    return taint(taint(taint(taint(acc, x.x), x.y), x.z), x.w);
}

#define REUSE_KERNEL(NAME, ROWS, TI, LOAD, LOAD2, TO, STORE, STORE2)                                      \
extern "C" __global__ void __launch_bounds__(256) NAME(                                             \
    const TI* __restrict__ src, TO* __restrict__ dst, int n, int cols, int dst_row, int dst_rows,     \
    const float* __restrict__ p, const float* __restrict__ wt, const i64* __restrict__ jobs,          \
    const float* __restrict__ cosv, const float* __restrict__ sinv, int rotate,                       \
    int n_heads, int head_dim, int rotary_dims, int interleaved, int* bad) {                          \
    extern __shared__ float4 coef4[];                                                                 \
    float* coef = (float*)coef4;                                                                      \
    const int layer = blockIdx.y, row0 = blockIdx.x * ROWS;                                           \
    const int rows = min(ROWS, n - row0);                                                             \
    const i64 p_off = jobs[3 * layer], wt_off = jobs[3 * layer + 1];                                  \
    const int rank = (int)jobs[3 * layer + 2], rank4 = (rank + 3) & ~3;                               \
    /* The tile's P rows, zero-padded to a multiple of 4 columns. */                                  \
    for (int i = threadIdx.x; i < ROWS * rank4; i += blockDim.x) {                                    \
        int r = i / rank4, j = i - r * rank4;                                                         \
        coef[i] = (r < rows && j < rank) ? p[p_off + (i64)(row0 + r) * rank + j] : 0.f;               \
    }                                                                                                 \
    __syncthreads();                                                                                  \
    const int half = rotary_dims >> 1, unit_per_head = head_dim >> 1, units = (cols + 1) >> 1;       \
    const i64 in_base = ((i64)layer * n + row0) * cols;                                               \
    const i64 out_base = ((i64)layer * dst_rows + dst_row + row0) * cols;                             \
    const float* w = wt + wt_off;                                                                     \
    float nf = 0.f;                                                                                   \
    for (int u = threadIdx.x; u < units; u += blockDim.x) {                                           \
        int a = 2 * u, b = a + 1, pair = -1;                                                          \
        const int h = u / unit_per_head, k = u - h * unit_per_head;                                   \
        if (rotate && h < n_heads && k < half) {                                                      \
            pair = k;                                                                                 \
            if (!interleaved) { a = h * head_dim + k; b = a + half; }                                 \
        }                                                                                             \
        const int adjacent = (b == a + 1) && ((cols & 1) == 0);                                       \
        const int has_b = b < cols;                                                                   \
        float xa[ROWS], xb[ROWS];                                                                     \
        _Pragma("unroll") for (int r = 0; r < ROWS; ++r) {                                            \
            xa[r] = 0.f; xb[r] = 0.f;                                                                 \
            if (r < rows) {                                                                           \
                const i64 o = in_base + (i64)r * cols;                                                \
                if (adjacent) { float2 v = LOAD2(src, o + a); xa[r] = v.x; xb[r] = v.y; }             \
                else { xa[r] = LOAD(src, o + a); if (has_b) xb[r] = LOAD(src, o + b); }               \
            }                                                                                         \
        }                                                                                             \
        for (int j0 = 0; j0 < rank4; j0 += 4) {                                                       \
            float wa[4], wb[4];                                                                       \
            _Pragma("unroll") for (int q = 0; q < 4; ++q) {                                           \
                const int j = j0 + q;                                                                 \
                wa[q] = j < rank ? w[(i64)j * cols + a] : 0.f;                                        \
                wb[q] = (j < rank && has_b) ? w[(i64)j * cols + b] : 0.f;                             \
            }                                                                                         \
            _Pragma("unroll") for (int r = 0; r < ROWS; ++r) {                                        \
                const float4 c = coef4[(r * rank4 + j0) >> 2];                                        \
                xa[r] += c.x * wa[0]; xa[r] += c.y * wa[1]; xa[r] += c.z * wa[2]; xa[r] += c.w * wa[3]; \
                xb[r] += c.x * wb[0]; xb[r] += c.y * wb[1]; xb[r] += c.z * wb[2]; xb[r] += c.w * wb[3]; \
            }                                                                                         \
        }                                                                                             \
        if (pair >= 0) {                                                                              \
            const float cs = cosv[(i64)layer * half + pair], sn = sinv[(i64)layer * half + pair];     \
            _Pragma("unroll") for (int r = 0; r < ROWS; ++r) {                                        \
                const float x0 = xa[r], x1 = xb[r];                                                   \
                xa[r] = x0 * cs - x1 * sn;                                                            \
                xb[r] = x0 * sn + x1 * cs;                                                            \
            }                                                                                         \
        }                                                                                             \
        _Pragma("unroll") for (int r = 0; r < ROWS; ++r) {                                            \
            if (r < rows) {                                                                           \
                const i64 o = out_base + (i64)r * cols;                                               \
                nf = taint(nf, xa[r]); if (has_b) nf = taint(nf, xb[r]);                               \
                if (adjacent) STORE2(dst, o + a, xa[r], xb[r]);                                       \
                else { STORE(dst, o + a, xa[r]); if (has_b) STORE(dst, o + b, xb[r]); }               \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    if (nf != 0.f) *bad = 1;                                                                          \
}

REUSE_KERNEL(reuse_f32_f32, 8, float, load_f, load2_f, float, store_f, store2_f)
REUSE_KERNEL(reuse_f32_f16, 8, float, load_f, load2_f, u16, store_h, store2_h)
REUSE_KERNEL(reuse_f32_bf16, 8, float, load_f, load2_f, u16, store_b, store2_b)
REUSE_KERNEL(reuse_f16_f32, 8, u16, load_h, load2_h, float, store_f, store2_f)
REUSE_KERNEL(reuse_f16_f16, 8, u16, load_h, load2_h, u16, store_h, store2_h)
REUSE_KERNEL(reuse_f16_bf16, 8, u16, load_h, load2_h, u16, store_b, store2_b)
REUSE_KERNEL(reuse_bf16_f32, 8, u16, load_b, load2_b, float, store_f, store2_f)
REUSE_KERNEL(reuse_bf16_f16, 8, u16, load_b, load2_b, u16, store_h, store2_h)
REUSE_KERNEL(reuse_bf16_bf16, 8, u16, load_b, load2_b, u16, store_b, store2_b)

// Per-dtype access for the four-column kernels: `Raw` is what one 4-column unit of one row
// occupies in registers before conversion (float4 for f32, two 32-bit words for 16-bit types),
// so 16-bit rows cost half the registers and twice as many can be in flight per thread.
struct F32 {
    typedef float T;
    typedef float4 Raw;
    static __device__ __forceinline__ Raw load(const T* p, i64 o, int a, int b, int split) {
        if (split) {
            const float2 lo = *(const float2*)(p + o + a), hi = *(const float2*)(p + o + b);
            return make_float4(lo.x, lo.y, hi.x, hi.y);
        }
        return *(const float4*)(p + o + a);
    }
    static __device__ __forceinline__ float4 unpack(Raw r) { return r; }
    static __device__ __forceinline__ void store(T* p, i64 o, int a, int b, int split, float4 x) {
        if (split) { store2_f(p, o + a, x.x, x.y); store2_f(p, o + b, x.z, x.w); }
        else store4_f(p, o + a, x);
    }
};
struct F16 {
    typedef u16 T;
    typedef uint2 Raw;
    static __device__ __forceinline__ Raw load(const T* p, i64 o, int a, int b, int split) {
        if (split) return make_uint2(*(const u32*)(p + o + a), *(const u32*)(p + o + b));
        return *(const uint2*)(p + o + a);
    }
    static __device__ __forceinline__ float4 unpack(Raw r) {
        return make_float4(h2f((u16)(r.x & 0xffffu)), h2f((u16)(r.x >> 16)), h2f((u16)(r.y & 0xffffu)),
                           h2f((u16)(r.y >> 16)));
    }
    static __device__ __forceinline__ void store(T* p, i64 o, int a, int b, int split, float4 x) {
        if (split) { store2_h(p, o + a, x.x, x.y); store2_h(p, o + b, x.z, x.w); }
        else store4_h(p, o + a, x);
    }
};
struct BF16 {
    typedef u16 T;
    typedef uint2 Raw;
    static __device__ __forceinline__ Raw load(const T* p, i64 o, int a, int b, int split) {
        return F16::load(p, o, a, b, split);
    }
    static __device__ __forceinline__ float4 unpack(Raw r) {
        return make_float4(__uint_as_float(r.x << 16), __uint_as_float(r.x & 0xffff0000u),
                           __uint_as_float(r.y << 16), __uint_as_float(r.y & 0xffff0000u));
    }
    static __device__ __forceinline__ void store(T* p, i64 o, int a, int b, int split, float4 x) {
        if (split) { store2_b(p, o + a, x.x, x.y); store2_b(p, o + b, x.z, x.w); }
        else store4_b(p, o + a, x);
    }
};

// Copies a tile of a row-major matrix into shared memory: rows row0.. of `src` (row stride
// `src_stride`; `rows` rows and `valid` columns hold data) into `max_rows` × `width` slots of
// `dst` (row stride `dst_stride`), zero elsewhere, with 8 loads in flight per thread (a plain
// load-then-store loop would wait out one memory latency per element).
template <class T>
__device__ __forceinline__ void stage(T* dst, int dst_stride, const T* __restrict__ src, i64 src_stride, int row0,
                                      int rows, int valid, int width, int max_rows) {
    const int total = max_rows * width;
    for (int base = 0; base < total; base += 8 * blockDim.x) {
        T v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int i = base + k * blockDim.x + threadIdx.x, r = i / width, j = i - r * width;
            v[k] = (i < total && r < rows && j < valid) ? src[(i64)(row0 + r) * src_stride + j] : (T)0;
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int i = base + k * blockDim.x + threadIdx.x, r = i / width, j = i - r * width;
            if (i < total) dst[r * dst_stride + j] = v[k];
        }
    }
}

// Where a 4-column unit `u` lives: a half-split rotary unit is columns (a, a+1 | b, b+1) with
// pairs (x0, x2), (x1, x3); any other unit is four adjacent columns a..a+3 with pairs (x0, x1),
// (x2, x3) where they rotate. `pair` is the first rotary pair index, `rot` whether R applies.
struct Unit {
    int a, b, pair, rot, split;
    __device__ __forceinline__ Unit(int u, int rotate, int n_heads, int head_dim, int rotary_dims, int interleaved) {
        const int unit_per_head = head_dim >> 2;
        const int h = rotate ? u / unit_per_head : 0, k4 = rotate ? u - h * unit_per_head : 0;
        rot = rotate && h < n_heads && 4 * k4 < rotary_dims;
        split = rot && !interleaved;
        a = split ? h * head_dim + 2 * k4 : 4 * u;
        b = a + (rotary_dims >> 1);
        pair = 2 * k4;
    }
    __device__ __forceinline__ float4 turn(float4 v, float c0, float s0, float c1, float s1) const {
        if (split) return make_float4(v.x * c0 - v.z * s0, v.y * c1 - v.w * s1, v.x * s0 + v.z * c0, v.y * s1 + v.w * c1);
        return make_float4(v.x * c0 - v.y * s0, v.x * s0 + v.y * c0, v.z * c1 - v.w * s1, v.z * s1 + v.w * c1);
    }
};

// The op with units of four columns (two rotary pairs), for shapes where every head, the
// rotary span and the row are multiples of 4 (the host checks). Loads and stores are 8 (16-bit)
// or 16 (f32) bytes wide; a thread loads ROWS rows of its unit at once (16 for 16-bit sources,
// 8 for f32: the same bytes in flight), then patches, rotates and stores them BATCH rows at a
// time, reading Wᵀ four ranks at a time and the tile's P rows from shared memory.
template <class In, class Out, int ROWS, int BATCH>
__device__ __forceinline__ void reuse4_body(
    const typename In::T* __restrict__ src, typename Out::T* __restrict__ dst, int n, int cols, int dst_row,
    int dst_rows, const float* __restrict__ p, const float* __restrict__ wt, const i64* __restrict__ jobs,
    const float* __restrict__ cosv, const float* __restrict__ sinv, int rotate, int n_heads, int head_dim,
    int rotary_dims, int interleaved, int* bad) {
    extern __shared__ float4 coef4[];
    float* coef = (float*)coef4;
    const int layer = blockIdx.y, row0 = blockIdx.x * ROWS;
    const int rows = min(ROWS, n - row0);
    // One 4-column unit per thread (blockIdx.z picks the group of units).
    const int u = blockIdx.z * blockDim.x + threadIdx.x, active = u < (cols >> 2);
    const Unit un(u, rotate, n_heads, head_dim, rotary_dims, interleaved);
    const i64 in_base = ((i64)layer * n + row0) * cols;
    const i64 out_base = ((i64)layer * dst_rows + dst_row + row0) * cols;
    // The rows are requested first so that they are in flight while P is staged.
    typename In::Raw raw[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
        if (active && r < rows) raw[r] = In::load(src, in_base + (i64)r * cols, un.a, un.b, un.split);
    const i64 p_off = jobs[3 * layer], wt_off = jobs[3 * layer + 1];
    const int rank = (int)jobs[3 * layer + 2], rank4 = (rank + 3) & ~3;
    stage(coef, rank4, p + p_off, rank, row0, rows, rank, rank4, ROWS);
    __syncthreads();
    if (!active) return;
    const float* w = wt + wt_off;
    float c0 = 1.f, s0 = 0.f, c1 = 1.f, s1 = 0.f;
    if (un.rot) {
        const i64 t = (i64)layer * (rotary_dims >> 1) + un.pair;
        c0 = cosv[t]; s0 = sinv[t]; c1 = cosv[t + 1]; s1 = sinv[t + 1];
    }
    float nf = 0.f;
#pragma unroll
    for (int b0 = 0; b0 < ROWS; b0 += BATCH) {
        float4 x[BATCH];
#pragma unroll
        for (int r = 0; r < BATCH; ++r) x[r] = b0 + r < rows ? In::unpack(raw[b0 + r]) : make_float4(0.f, 0.f, 0.f, 0.f);
        for (int j0 = 0; j0 < rank4; j0 += 4) {
            float4 wq[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int j = j0 + q;
                wq[q] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (j < rank) {
                    const float* wj = w + (i64)j * cols;
                    if (un.split) {
                        const float2 lo = *(const float2*)(wj + un.a), hi = *(const float2*)(wj + un.b);
                        wq[q] = make_float4(lo.x, lo.y, hi.x, hi.y);
                    } else wq[q] = *(const float4*)(wj + un.a);
                }
            }
#pragma unroll
            for (int r = 0; r < BATCH; ++r) {
                const float4 c = coef4[((b0 + r) * rank4 + j0) >> 2];
                const float cj[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    x[r].x += cj[q] * wq[q].x; x[r].y += cj[q] * wq[q].y;
                    x[r].z += cj[q] * wq[q].z; x[r].w += cj[q] * wq[q].w;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < BATCH; ++r) {
            if (b0 + r < rows) {
                const float4 v = un.rot ? un.turn(x[r], c0, s0, c1, s1) : x[r];
                nf = taint4(nf, v);
                Out::store(dst, out_base + (i64)(b0 + r) * cols, un.a, un.b, un.split, v);
            }
        }
    }
    if (nf != 0.f) *bad = 1;
}

#define WIDE_ARGS                                                                                      \
    int n, int cols, int dst_row, int dst_rows, const float* __restrict__ p, const float* __restrict__ wt, \
        const i64* __restrict__ jobs, const float* __restrict__ cosv, const float* __restrict__ sinv,    \
        int rotate, int n_heads, int head_dim, int rotary_dims, int interleaved
#define WIDE_PASS n, cols, dst_row, dst_rows, p, wt, jobs, cosv, sinv, rotate, n_heads, head_dim, rotary_dims, interleaved

// 16-bit sources: 16 rows, patched in one batch (no second pass over Wᵀ; measured 8-15% faster
// on the H200 than two batches of 8 at rank 16-32).
#define REUSE4(NAME, IN, OUT, ROWS, BATCH)                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                 \
        NAME(const IN::T* __restrict__ src, OUT::T* __restrict__ dst, WIDE_ARGS, int* bad) {           \
        reuse4_body<IN, OUT, ROWS, BATCH>(src, dst, WIDE_PASS, bad);                                   \
    }
REUSE4(reuse4_f32_f32, F32, F32, 8, 8)
REUSE4(reuse4_f32_f16, F32, F16, 8, 8)
REUSE4(reuse4_f32_bf16, F32, BF16, 8, 8)
REUSE4(reuse4_f16_f32, F16, F32, 16, 16)
REUSE4(reuse4_f16_f16, F16, F16, 16, 16)
REUSE4(reuse4_f16_bf16, F16, BF16, 16, 16)
REUSE4(reuse4_bf16_f32, BF16, F32, 16, 16)
REUSE4(reuse4_bf16_f16, BF16, F16, 16, 16)
REUSE4(reuse4_bf16_bf16, BF16, BF16, 16, 16)

// Tensor-core patch (sm_80+) for 16-bit patch factors (bf16 or f16, as stored): the MMA
// multiplies them exactly and sums in f32, so this matches the CPU reference as the FMA kernels
// do. A block owns one column chunk (whole heads, at most 512 columns) of TC_TILES tiles of
// TC_ROWS rows: it stages the chunk's Wᵀ in shared memory once; per tile it stages P, forms the
// 16 × chunk tile of P·Wᵀ with mma.m16n8k16 (each warp a strip of 8-column tiles) into shared
// memory while the next tile's rows and P are already loading, and each thread adds the patch to its
// 4-column unit of 8 of the 16 rows, rotates and stores. Shared memory: patch
// [TC_ROWS][chunk + TC_PAD] f32, Wᵀ [kp][chunk + TC_PAD] and P [TC_ROWS][kp + TC_PAD] as 16-bit
// words, kp = rank rounded up to 16.
#define TC_ROWS 16
#define TC_TILES 8
#define TC_PAD 8

template <class In, class Out, int BF>
__device__ __forceinline__ void reuse4tc_body(
    const typename In::T* __restrict__ src, typename Out::T* __restrict__ dst, int n, int cols, int dst_row,
    int dst_rows, const u16* __restrict__ p, const u16* __restrict__ wt, const i64* __restrict__ jobs,
    const float* __restrict__ cosv, const float* __restrict__ sinv, int rotate, int n_heads, int head_dim,
    int rotary_dims, int interleaved, int chunk_cols, int* bad) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ float4 smem4[];
    const int layer = blockIdx.y, tid = threadIdx.x;
    const int c0 = blockIdx.z * chunk_cols, width = min(chunk_cols, cols - c0);
    const i64 p_off = jobs[3 * layer], wt_off = jobs[3 * layer + 1];
    const int rank = (int)jobs[3 * layer + 2], kp = ((rank + 15) >> 4) << 4;
    const int stride = chunk_cols + TC_PAD, pstride = kp + TC_PAD;
    float* patch = (float*)smem4;
    u16* wtile = (u16*)(patch + TC_ROWS * stride);
    u16* ptile = wtile + kp * stride;
    stage(wtile, stride, wt + wt_off + c0, cols, 0, rank, width, chunk_cols, kp);
    // Thread = (half of the tile's rows, 4-column unit of the chunk).
    const int lanes = blockDim.x >> 1, part = tid >= lanes, ui = tid - part * lanes;
    const int active = ui < (width >> 2);
    const Unit un((c0 >> 2) + ui, rotate, n_heads, head_dim, rotary_dims, interleaved);
    float c_0 = 1.f, s_0 = 0.f, c_1 = 1.f, s_1 = 0.f;
    if (un.rot) {
        const i64 t = (i64)layer * (rotary_dims >> 1) + un.pair;
        c_0 = cosv[t]; s_0 = sinv[t]; c_1 = cosv[t + 1]; s_1 = sinv[t + 1];
    }
    const int lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int first = blockIdx.x * TC_TILES * TC_ROWS;
    typename In::Raw cur[8], nxt[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int row = first + part * 8 + r;
        if (active && row < n) cur[r] = In::load(src, ((i64)layer * n + row) * cols, un.a, un.b, un.split);
    }
    // The next tile's P rows wait in registers (up to 4 values per thread) until its turn.
    const int pcount = TC_ROWS * kp, pregs = pcount <= 4 * (int)blockDim.x;
    u16 pn[4];
    auto fetch_p = [&](int r0) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int i = k * blockDim.x + tid, r = i / max(kp, 1), j = i - r * kp;
            pn[k] = (i < pcount && r0 + r < n && j < rank) ? p[p_off + (i64)(r0 + r) * rank + j] : (u16)0;
        }
    };
    if (pregs) fetch_p(first);
    float nf = 0.f;
    for (int tile = 0; tile < TC_TILES; ++tile) {
        const int row0 = first + tile * TC_ROWS;
        if (row0 >= n) break;
        const int rows = min(TC_ROWS, n - row0);
        if (pregs) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int i = k * blockDim.x + tid, r = i / max(kp, 1), j = i - r * kp;
                if (i < pcount) ptile[r * pstride + j] = pn[k];
            }
        } else {
            stage(ptile, pstride, p + p_off, rank, row0, rows, rank, kp, TC_ROWS);
        }
        __syncthreads();
        // The next tile's rows start loading now and land during the MMA and the stores.
        if (tile + 1 < TC_TILES) {
#pragma unroll
            for (int r = 0; r < 8; ++r) {
                const int row = row0 + TC_ROWS + part * 8 + r;
                if (active && row < n) nxt[r] = In::load(src, ((i64)layer * n + row) * cols, un.a, un.b, un.split);
            }
            if (pregs) fetch_p(row0 + TC_ROWS);
        }
        if (rank > 0) {
            for (int nt = warp; nt < ((width + 7) >> 3); nt += nwarps) {
                const int nc = nt * 8 + g;
                float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
                for (int kb = 2 * t4; kb < kp; kb += 16) {
                    const u32 a0 = *(const u32*)(ptile + g * pstride + kb);
                    const u32 a1 = *(const u32*)(ptile + (g + 8) * pstride + kb);
                    const u32 a2 = *(const u32*)(ptile + g * pstride + kb + 8);
                    const u32 a3 = *(const u32*)(ptile + (g + 8) * pstride + kb + 8);
                    const u32 b0 = (u32)wtile[kb * stride + nc] | ((u32)wtile[(kb + 1) * stride + nc] << 16);
                    const u32 b1 = (u32)wtile[(kb + 8) * stride + nc] | ((u32)wtile[(kb + 9) * stride + nc] << 16);
                    if (BF)
                        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                                     : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
                    else
                        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                                     : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
                }
                const int cc = nt * 8 + 2 * t4;
                *(float2*)(patch + g * stride + cc) = make_float2(d0, d1);
                *(float2*)(patch + (g + 8) * stride + cc) = make_float2(d2, d3);
            }
            __syncthreads();
        }
        if (active) {
#pragma unroll
            for (int r = 0; r < 8; ++r) {
                const int rr = part * 8 + r;
                if (rr < rows) {
                    float4 v = In::unpack(cur[r]);
                    if (rank > 0) {
                        const float* pr = patch + rr * stride - c0;
                        if (un.split) {
                            const float2 lo = *(const float2*)(pr + un.a), hi = *(const float2*)(pr + un.b);
                            v.x += lo.x; v.y += lo.y; v.z += hi.x; v.w += hi.y;
                        } else {
                            const float4 q = *(const float4*)(pr + un.a);
                            v.x += q.x; v.y += q.y; v.z += q.z; v.w += q.w;
                        }
                    }
                    if (un.rot) v = un.turn(v, c_0, s_0, c_1, s_1);
                    nf = taint4(nf, v);
                    Out::store(dst, ((i64)layer * dst_rows + dst_row + row0 + rr) * cols, un.a, un.b, un.split, v);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 8; ++r) cur[r] = nxt[r];
    }
    if (nf != 0.f) *bad = 1;
#else
    // Below sm_80 there is no 16-bit MMA; the host never launches these there.
    __trap();
#endif
}

// Only 16-bit sources: f32 rows are faster on the FMA kernel. At most 85 registers (3 blocks of
// 256 threads per SM), measured 6-7% faster than the compiler's own choice.
#define REUSE4TC(NAME, IN, OUT)                                                                        \
    extern "C" __global__ void __launch_bounds__(256, 3) NAME##_bf16(                                    \
        const IN::T* __restrict__ src, OUT::T* __restrict__ dst, int n, int cols, int dst_row, int dst_rows, \
        const u16* __restrict__ p, const u16* __restrict__ wt, const i64* __restrict__ jobs,          \
        const float* __restrict__ cosv, const float* __restrict__ sinv, int rotate, int n_heads,      \
        int head_dim, int rotary_dims, int interleaved, int chunk_cols, int* bad) {                   \
        reuse4tc_body<IN, OUT, 1>(src, dst, n, cols, dst_row, dst_rows, p, wt, jobs, cosv, sinv, rotate, \
                                  n_heads, head_dim, rotary_dims, interleaved, chunk_cols, bad);      \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(256, 3) NAME##_f16(                                     \
        const IN::T* __restrict__ src, OUT::T* __restrict__ dst, int n, int cols, int dst_row, int dst_rows, \
        const u16* __restrict__ p, const u16* __restrict__ wt, const i64* __restrict__ jobs,          \
        const float* __restrict__ cosv, const float* __restrict__ sinv, int rotate, int n_heads,      \
        int head_dim, int rotary_dims, int interleaved, int chunk_cols, int* bad) {                   \
        reuse4tc_body<IN, OUT, 0>(src, dst, n, cols, dst_row, dst_rows, p, wt, jobs, cosv, sinv, rotate, \
                                  n_heads, head_dim, rotary_dims, interleaved, chunk_cols, bad);      \
    }
REUSE4TC(reuse4tc_f16_f32, F16, F32)
REUSE4TC(reuse4tc_f16_f16, F16, F16)
REUSE4TC(reuse4tc_f16_bf16, F16, BF16)
REUSE4TC(reuse4tc_bf16_f32, BF16, F32)
REUSE4TC(reuse4tc_bf16_f16, BF16, F16)
REUSE4TC(reuse4tc_bf16_bf16, BF16, BF16)


// Pipelined tensor-core kernels (sm_80+), for 16-bit rows whose staged pieces are 16-byte
// aligned (row width, column chunk and Wᵀ offset multiples of 8 elements, 16-byte aligned
// buffers; the host checks, and rank ≤ 16·TCP_KSTEPS). Same math as reuse4tc_*: the patch is
// formed by mma.m16n8k16 from 16-bit P and Wᵀ (exact products, f32 sums) into an f32 tile in
// shared memory, then each thread adds it to its 4-column unit of a few rows, rotates and stores.
// What differs is how the rows arrive: `cp.async` copies each tile's source rows and P rows
// straight into a ring of TCP_STAGES shared-memory slots, TCP_STAGES - 1 tiles ahead of the one
// being computed, so several tiles' loads are in flight per block without holding them in
// registers; Wᵀ arrives the same way, with the first tile. One barrier per tile (two with a
// patch): the one that publishes tile t's copies also frees the slot tile t - 1 used, which the
// copies of tile t + TCP_STAGES - 1 then reuse. Shared memory (stride = chunk + TC_PAD):
//   rows  [TCP_STAGES][TC_ROWS][stride] 16-bit   patch [TC_ROWS][stride] f32
//   Wᵀ    [kp][stride] 16-bit                    P     [TCP_STAGES][TC_ROWS·kp + 8] 16-bit
// A tile's P rows are one contiguous run of rows·rank words, copied from the 16-byte boundary at
// or below its start (`lead` words before it) and read back with row stride `rank`; the last
// piece reads only up to the run's end (the rest of it is zero-filled).
#define TCP_STAGES 4
#define TCP_KSTEPS 4

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\n" : "=r"(a) : "l"(p));
    return a;
}
// 16 bytes global → shared, asynchronously; only the first `bytes` are read, the rest zeroed.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Two adjacent 16-bit values of a P row as one MMA operand word (low = column j), zero at and
// past `rank` (a staged P row is followed by the next row's values, or by stale words).
__device__ __forceinline__ u32 p_pair(const u16* row, int j, int rank) {
    const u32 lo = j < rank ? row[j] : 0u, hi = j + 1 < rank ? row[j + 1] : 0u;
    return lo | (hi << 16);
}
template <int BF>
__device__ __forceinline__ void mma16816(float& d0, float& d1, float& d2, float& d3, const u32* a, u32 b0, u32 b1) {
    if (BF)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <class In, class Out, int BF>
__device__ __forceinline__ void reuse4tcp_body(
    const typename In::T* __restrict__ src, typename Out::T* __restrict__ dst, int n, int cols, int dst_row,
    int dst_rows, const u16* __restrict__ p, const u16* __restrict__ wt, const i64* __restrict__ jobs,
    const float* __restrict__ cosv, const float* __restrict__ sinv, int rotate, int n_heads, int head_dim,
    int rotary_dims, int interleaved, int chunk_cols, int tiles, int* bad) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ float4 smem4[];
    const int layer = blockIdx.y, tid = threadIdx.x, nthreads = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5, g = lane >> 2, t4 = lane & 3;
    const int c0 = blockIdx.z * chunk_cols, width = min(chunk_cols, cols - c0), pieces = width >> 3;
    const i64 p_off = jobs[3 * layer], wt_off = jobs[3 * layer + 1];
    const int rank = (int)jobs[3 * layer + 2], kp = ((rank + 15) >> 4) << 4, nks = kp >> 4;
    // The host only plans this kernel where every staged piece is 16-byte aligned; anything else
    // stops here rather than faulting in a copy.
    if (((cols | chunk_cols) & 7) || (((size_t)src | (size_t)p | (size_t)wt) & 15) || (wt_off & 7) ||
        nks > TCP_KSTEPS || (chunk_cols >> 2) > nthreads)
        __trap();
    const int stride = chunk_cols + TC_PAD, pslot = TC_ROWS * kp + 8;
    u16* rows_s = (u16*)smem4;
    float* patch = (float*)(rows_s + TCP_STAGES * TC_ROWS * stride);
    u16* wtile = (u16*)(patch + TC_ROWS * stride);
    u16* ptiles = wtile + kp * stride;
    const int first = blockIdx.x * tiles * TC_ROWS;
    const int ntiles = min(tiles, (n - first + TC_ROWS - 1) / TC_ROWS);
    const typename In::T* src_l = src + (i64)layer * n * cols + c0;
    const u16* p_l = p + p_off;
    // This thread's 16-byte piece of a staged row and its first row (rstep rows apart).
    const int rstep = nthreads / pieces, pj = tid % pieces, prow = tid < rstep * pieces ? tid / pieces : TC_ROWS;
    // Copies tile t's rows (and P rows) into slot t % TCP_STAGES and commits them as one group;
    // past the last tile the group is empty, so every thread always commits one group per call.
    auto issue = [&](int t) {
        if (t < ntiles) {
            const int row0 = first + t * TC_ROWS, rows = min(TC_ROWS, n - row0), slot = t % TCP_STAGES;
            u16* rs = rows_s + slot * TC_ROWS * stride;
            const typename In::T* g0 = src_l + (i64)row0 * cols + 8 * pj;
            for (int r = prow; r < rows; r += rstep) cp_async16(smem_u32(rs + r * stride + 8 * pj), g0 + (i64)r * cols, 16);
            if (rank > 0) {
                const u16* run = p_l + (i64)row0 * rank;
                const u16* base = (const u16*)((size_t)run & ~(size_t)15);
                const int words = (int)(run - base) + rows * rank, np = (words + 7) >> 3;
                u16* ps = ptiles + slot * pslot;
                for (int i = tid; i < np; i += nthreads)
                    cp_async16(smem_u32(ps + 8 * i), base + 8 * i, min(16, 2 * (words - 8 * i)));
            }
        }
        cp_async_commit();
    };
    // Wᵀ rows 0..rank of the chunk; rows rank..kp zero (src-size 0 reads nothing), so that the
    // zero-padded ranks add exactly 0. It lands with tile 0's group.
    if (rank > 0) {
        const u16* w = wt + wt_off + c0;
        for (int i = tid; i < kp * pieces; i += nthreads) {
            const int k = i / pieces, j = i - k * pieces;
            cp_async16(smem_u32(wtile + k * stride + 8 * j), k < rank ? w + (i64)k * cols + 8 * j : w, k < rank ? 16 : 0);
        }
    }
#pragma unroll
    for (int t = 0; t < TCP_STAGES - 1; ++t) issue(t);
    // Epilogue threads: `groups` row groups of `ulanes` (a power of two ≥ the chunk's units).
    int ulanes = 1;
    while (ulanes < (chunk_cols >> 2)) ulanes <<= 1;
    const int groups = min(TC_ROWS, max(1, nthreads / ulanes)), ui = tid & (ulanes - 1), rg = tid / ulanes;
    const int active = ui < (width >> 2) && rg < groups;
    const Unit un((c0 >> 2) + ui, rotate, n_heads, head_dim, rotary_dims, interleaved);
    float c_0 = 1.f, s_0 = 0.f, c_1 = 1.f, s_1 = 0.f;
    if (active && un.rot) {
        const i64 t = (i64)layer * (rotary_dims >> 1) + un.pair;
        c_0 = cosv[t]; s_0 = sinv[t]; c_1 = cosv[t + 1]; s_1 = sinv[t + 1];
    }
    const u32 w_s = smem_u32(wtile);
    float nf = 0.f;
    for (int t = 0; t < ntiles; ++t) {
        // Tile t's copies (and Wᵀ) are this thread's oldest groups; after the barrier everyone's
        // are visible, and every thread is done with tile t - 1 (its slot and the patch tile).
        cp_async_wait<TCP_STAGES - 2>();
        __syncthreads();
        issue(t + TCP_STAGES - 1);
        const int row0 = first + t * TC_ROWS, rows = min(TC_ROWS, n - row0), slot = t % TCP_STAGES;
        if (rank > 0) {
            // A operands (P rows g and g + 8), the same for every n-tile of this warp.
            const u16* ps = ptiles + slot * pslot + (((size_t)(p_l + (i64)row0 * rank) & 15) >> 1);
            const u16 *pr0 = ps + g * rank, *pr1 = ps + (g + 8) * rank;
            // Word loads where the pairs are 4-byte aligned and no rank is padded (rank a multiple
            // of 16, e.g. every bench and budget-free patch), masked 16-bit loads otherwise.
            const int fast = (((size_t)ps & 3) | (rank & 15)) == 0;
            u32 a[TCP_KSTEPS][4];
#pragma unroll
            for (int ks = 0; ks < TCP_KSTEPS; ++ks) {
                const int kb = ks * 16 + 2 * t4;
                if (ks >= nks) {
                    a[ks][0] = a[ks][1] = a[ks][2] = a[ks][3] = 0u;
                } else if (fast) {
                    a[ks][0] = *(const u32*)(pr0 + kb); a[ks][1] = *(const u32*)(pr1 + kb);
                    a[ks][2] = *(const u32*)(pr0 + kb + 8); a[ks][3] = *(const u32*)(pr1 + kb + 8);
                } else {
                    a[ks][0] = p_pair(pr0, kb, rank); a[ks][1] = p_pair(pr1, kb, rank);
                    a[ks][2] = p_pair(pr0, kb + 8, rank); a[ks][3] = p_pair(pr1, kb + 8, rank);
                }
            }
            for (int nt = warp; nt < (width >> 3); nt += nwarps) {
                float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
#pragma unroll
                for (int ks = 0; ks < TCP_KSTEPS; ks += 2) {
                    if (ks + 1 < nks) {
                        // B operands of k-steps ks and ks + 1: lane l names Wᵀ row 16·ks + l; the
                        // transposed 8×8 loads give each thread (k = 2·t4, 2·t4 + 1; n = g) pairs.
                        u32 b0, b1, b2, b3;
                        const u32 at = w_s + (u32)(((ks * 16 + lane) * stride + nt * 8) * 2);
                        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                                     : "r"(at));
                        mma16816<BF>(d0, d1, d2, d3, a[ks], b0, b1);
                        mma16816<BF>(d0, d1, d2, d3, a[ks + 1], b2, b3);
                    } else if (ks < nks) {
                        u32 b0, b1;
                        const u32 at = w_s + (u32)(((ks * 16 + (lane & 15)) * stride + nt * 8) * 2);
                        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                                     : "=r"(b0), "=r"(b1)
                                     : "r"(at));
                        mma16816<BF>(d0, d1, d2, d3, a[ks], b0, b1);
                    }
                }
                const int cc = nt * 8 + 2 * t4;
                *(float2*)(patch + g * stride + cc) = make_float2(d0, d1);
                *(float2*)(patch + (g + 8) * stride + cc) = make_float2(d2, d3);
            }
            __syncthreads();
        }
        if (active) {
            // Shared tiles are indexed by the unit's global columns (a, b) less c0.
            const typename In::T* rs = rows_s + slot * TC_ROWS * stride - c0;
            const float* pt = patch - c0;
#pragma unroll 4
            for (int r = rg; r < rows; r += groups) {
                float4 v = In::unpack(In::load(rs, (i64)r * stride, un.a, un.b, un.split));
                if (rank > 0) {
                    const float* pr = pt + r * stride;
                    if (un.split) {
                        const float2 lo = *(const float2*)(pr + un.a), hi = *(const float2*)(pr + un.b);
                        v.x += lo.x; v.y += lo.y; v.z += hi.x; v.w += hi.y;
                    } else {
                        const float4 q = *(const float4*)(pr + un.a);
                        v.x += q.x; v.y += q.y; v.z += q.z; v.w += q.w;
                    }
                }
                if (un.rot) v = un.turn(v, c_0, s_0, c_1, s_1);
                nf = taint4(nf, v);
                Out::store(dst, ((i64)layer * dst_rows + dst_row + row0 + r) * cols, un.a, un.b, un.split, v);
            }
        }
    }
    if (nf != 0.f) *bad = 1;
#else
    __trap();
#endif
}

// 16-bit rows only. 256 threads; at most 80 registers (3 blocks per SM where shared memory
// allows: 70 KB per block at chunk 256, rank 32).
#define REUSE4TCP(NAME, IN, OUT)                                                                       \
    extern "C" __global__ void __launch_bounds__(256, 3) NAME##_bf16(                                    \
        const IN::T* __restrict__ src, OUT::T* __restrict__ dst, int n, int cols, int dst_row, int dst_rows, \
        const u16* __restrict__ p, const u16* __restrict__ wt, const i64* __restrict__ jobs,          \
        const float* __restrict__ cosv, const float* __restrict__ sinv, int rotate, int n_heads,      \
        int head_dim, int rotary_dims, int interleaved, int chunk_cols, int tiles, int* bad) {        \
        reuse4tcp_body<IN, OUT, 1>(src, dst, n, cols, dst_row, dst_rows, p, wt, jobs, cosv, sinv, rotate, \
                                   n_heads, head_dim, rotary_dims, interleaved, chunk_cols, tiles, bad); \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(256, 3) NAME##_f16(                                     \
        const IN::T* __restrict__ src, OUT::T* __restrict__ dst, int n, int cols, int dst_row, int dst_rows, \
        const u16* __restrict__ p, const u16* __restrict__ wt, const i64* __restrict__ jobs,          \
        const float* __restrict__ cosv, const float* __restrict__ sinv, int rotate, int n_heads,      \
        int head_dim, int rotary_dims, int interleaved, int chunk_cols, int tiles, int* bad) {        \
        reuse4tcp_body<IN, OUT, 0>(src, dst, n, cols, dst_row, dst_rows, p, wt, jobs, cosv, sinv, rotate, \
                                   n_heads, head_dim, rotary_dims, interleaved, chunk_cols, tiles, bad); \
    }
REUSE4TCP(reuse4tcp_f16_f32, F16, F32)
REUSE4TCP(reuse4tcp_f16_f16, F16, F16)
REUSE4TCP(reuse4tcp_f16_bf16, F16, BF16)
REUSE4TCP(reuse4tcp_bf16_f32, BF16, F32)
REUSE4TCP(reuse4tcp_bf16_f16, BF16, F16)
REUSE4TCP(reuse4tcp_bf16_bf16, BF16, BF16)
