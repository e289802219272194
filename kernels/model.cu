// The transformer forward on the device (kamera-gpu's DeviceModel): everything but the matrix
// products, which cuBLAS does (bf16 inputs, f32 accumulate and output). Activations and the
// residual stream are f32; GEMM inputs and the KV context are bf16 (raw 16-bit words).
// CPU reference: kamera-model's block.rs / attention.rs (the same math, all f32).

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

__device__ __forceinline__ float bf(u16 b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ u16 to_bf(float x) {
    u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);  // NaN stays NaN
    return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                  // round to nearest even
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/// Sum over a block of at most 1024 threads (blockDim.x a multiple of 32); every thread gets it.
__device__ float block_sum(float x) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    x = warp_sum(x);
    __syncthreads();
    if (lane == 0) part[warp] = x;
    __syncthreads();
    float t = lane < warps ? part[lane] : 0.f;
    return warp_sum(t);
}

/// x[i, :] = table[ids[i], :] * scale. Grid: n blocks.
extern "C" __global__ void embed_rows(const u16* __restrict__ table, const u32* __restrict__ ids,
                                      float* __restrict__ x, int hidden, float scale) {
    const i64 row = (i64)ids[blockIdx.x] * hidden;
    float* out = x + (i64)blockIdx.x * hidden;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) out[c] = bf(table[row + c]) * scale;
}

/// RMS norm of each row of x (`[n, d]`, f32) times w, written as bf16 (a GEMM input) or f32 (in
/// place allowed). Grid: n blocks.
extern "C" __global__ void rms_norm_bf16(const float* __restrict__ x, const float* __restrict__ w,
                                         u16* __restrict__ out, int d, float eps) {
    const float* r = x + (i64)blockIdx.x * d;
    float s = 0.f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) s += r[c] * r[c];
    const float inv = rsqrtf(block_sum(s) / d + eps);
    u16* o = out + (i64)blockIdx.x * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) o[c] = to_bf(r[c] * inv * w[c]);
}
extern "C" __global__ void rms_norm_f32(const float* x, const float* __restrict__ w, float* out, int d, float eps) {
    const float* r = x + (i64)blockIdx.x * d;
    float s = 0.f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) s += r[c] * r[c];
    const float inv = rsqrtf(block_sum(s) / d + eps);
    float* o = out + (i64)blockIdx.x * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) o[c] = r[c] * inv * w[c];
}

/// After the fused QKV product (`qkv: [n, qd + 2·kvd]` f32, Q then K then V): adds the bias,
/// applies QK-norm per head (when the norm weights are given), rotates Q and K to positions
/// `pos0 + i` (cos/sin: `[n, rotary_dims/2]`), leaves Q in place (f32) and writes K and V as bf16
/// into rows `row0 + i` of this layer's context (`kc`, `vc`: `[cap, kvd]`).
/// Grid: n blocks of a multiple of 32 threads; one warp per head at a time.
extern "C" __global__ void qkv_rope(float* __restrict__ qkv, const float* __restrict__ bias,
                                    const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                    const float* __restrict__ cosv, const float* __restrict__ sinv,
                                    u16* __restrict__ kc, u16* __restrict__ vc, int row0, int heads,
                                    int kv_heads, int head_dim, int rotary_dims, int interleaved, float eps) {
    const int i = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int qd = heads * head_dim, kvd = kv_heads * head_dim, width = qd + 2 * kvd;
    float* row = qkv + (i64)i * width;
    if (bias) {
        for (int c = threadIdx.x; c < width; c += blockDim.x) row[c] += bias[c];
        __syncthreads();
    }
    const int half = rotary_dims / 2;
    const float* cs = cosv + (i64)i * half;
    const float* sn = sinv + (i64)i * half;
    for (int h = warp; h < heads + kv_heads; h += warps) {
        float* v = row + h * head_dim;  // Q heads, then K heads
        const float* nw = h < heads ? q_norm : k_norm;
        if (nw) {
            float s = 0.f;
            for (int d = lane; d < head_dim; d += 32) s += v[d] * v[d];
            const float inv = rsqrtf(warp_sum(s) / head_dim + eps);
            __syncwarp();
            for (int d = lane; d < head_dim; d += 32) v[d] = v[d] * inv * nw[d];
            __syncwarp();
        }
        for (int p = lane; p < half; p += 32) {
            const int a = interleaved ? 2 * p : p, b = interleaved ? 2 * p + 1 : p + half;
            const float x = v[a], y = v[b];
            v[a] = x * cs[p] - y * sn[p];
            v[b] = x * sn[p] + y * cs[p];
        }
        __syncwarp();
    }
    __syncthreads();
    const i64 dst = (i64)(row0 + i) * kvd;
    for (int c = threadIdx.x; c < kvd; c += blockDim.x) {
        kc[dst + c] = to_bf(row[qd + c]);
        vc[dst + c] = to_bf(row[qd + kvd + c]);
    }
}

#define ATT_WARPS 4
#define ATT_MAX_HD 256

/// Causal attention of the n new queries (f32 in `qkv`, row stride `qkv_stride`, query i at
/// position q_pos0 + i) over this layer's context rows 0..keys (bf16 `[cap, kvd]`, key j at
/// k_pos0 + j), GQA (query head h reads kv head h / (heads / kv_heads)), `window` > 0 limiting
/// q - k to below it. Online softmax in f32, one warp per (query, head): each lane scores one key
/// of a 32-key tile, then the warp accumulates the tile's values, each lane `head_dim / 32` dims.
/// Output: bf16 `[n, heads·head_dim]` (the Wo product's input). Grid: (ceil(n / 4), heads).
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS)
    attend(const float* __restrict__ qkv, int qkv_stride, const u16* __restrict__ kc, const u16* __restrict__ vc,
           u16* __restrict__ out, int n, int heads, int kv_heads, int head_dim, i64 q_pos0, i64 k_pos0,
           int keys, float scale, int window) {
    __shared__ float qs[ATT_WARPS][ATT_MAX_HD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int i = blockIdx.x * ATT_WARPS + warp, h = blockIdx.y;
    if (i >= n) return;  // whole warps only: no block-wide barrier below
    const int g = h / (heads / kv_heads), kvd = kv_heads * head_dim;
    const float* q = qkv + (i64)i * qkv_stride + h * head_dim;
    for (int d = lane; d < head_dim; d += 32) qs[warp][d] = q[d] * scale;
    __syncwarp();
    const i64 qp = q_pos0 + i;
    i64 hi = qp - k_pos0;  // last visible key
    if (hi > keys - 1) hi = keys - 1;
    i64 lo = 0;
    if (window > 0 && qp - window + 1 - k_pos0 > 0) lo = qp - window + 1 - k_pos0;
    const int per = head_dim / 32;  // dims per lane (head_dim % 32 == 0, <= 256)
    float acc[ATT_MAX_HD / 32];
#pragma unroll
    for (int r = 0; r < ATT_MAX_HD / 32; r++) acc[r] = 0.f;
    float m = __int_as_float(0xff800000), l = 0.f;  // -inf
    const u16* kg = kc + g * head_dim;
    const u16* vg = vc + g * head_dim;
    for (i64 j0 = lo; j0 <= hi; j0 += 32) {
        const i64 j = j0 + lane;
        float s = __int_as_float(0xff800000);
        if (j <= hi) {
            const uint4* kr = (const uint4*)(kg + j * kvd);
            float dot = 0.f;
            for (int c = 0; c < head_dim / 8; c++) {
                const uint4 w = kr[c];
                const float* qq = &qs[warp][c * 8];
                const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    dot = fmaf(qq[2 * e], __uint_as_float(ws[e] << 16), dot);
                    dot = fmaf(qq[2 * e + 1], __uint_as_float(ws[e] & 0xffff0000u), dot);
                }
            }
            s = dot;
        }
        const float mt = warp_max(s);
        const float mn = fmaxf(m, mt);  // finite: key j0 is visible
        const float corr = __expf(m - mn);
        const float p = j <= hi ? __expf(s - mn) : 0.f;
        l = l * corr + warp_sum(p);
#pragma unroll
        for (int r = 0; r < ATT_MAX_HD / 32; r++) acc[r] *= corr;
        const int count = (int)((hi - j0 + 1) < 32 ? (hi - j0 + 1) : 32);
        for (int t = 0; t < count; t++) {
            const float pt = __shfl_sync(0xffffffffu, p, t);
            const u16* vr = vg + (j0 + t) * kvd;
#pragma unroll
            for (int r = 0; r < ATT_MAX_HD / 32; r++)
                if (r < per) acc[r] = fmaf(pt, bf(vr[lane + 32 * r]), acc[r]);
        }
        m = mn;
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    u16* o = out + (i64)i * heads * head_dim + h * head_dim;
#pragma unroll
    for (int r = 0; r < ATT_MAX_HD / 32; r++)
        if (r < per) o[lane + 32 * r] = to_bf(acc[r] * inv);
}

/// MLP gate: out[i, c] = act(gu[i, c]) · gu[i, f + c] as bf16, `gu: [n, 2f]` (gate then up);
/// act = SiLU, or GELU (tanh approximation) when `gelu`. Grid-stride over n·f.
extern "C" __global__ void gate_mul(const float* __restrict__ gu, u16* __restrict__ out, i64 n, int f, int gelu) {
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < n * f; k += (i64)gridDim.x * blockDim.x) {
        const i64 i = k / f;
        const int c = (int)(k - i * f);
        const float g = gu[i * 2 * f + c], u = gu[i * 2 * f + f + c];
        float a;
        if (gelu) {
            a = 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
        } else {
            a = g / (1.f + __expf(-g));
        }
        out[k] = to_bf(a * u);
    }
}

/// x += y over `len` floats. Grid-stride.
extern "C" __global__ void add_f32(float* __restrict__ x, const float* __restrict__ y, i64 len) {
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < len; k += (i64)gridDim.x * blockDim.x) x[k] += y[k];
}

/// Copies rows 0..rows of each of `layers` layers from a `[layers, from_cap, cols]` buffer into
/// a `[layers, to_cap, cols]` one (a context growing). Grid-stride over layers·rows·cols.
extern "C" __global__ void copy_rows(const u16* __restrict__ src, u16* __restrict__ dst, int layers, i64 rows,
                                     i64 cols, i64 from_cap, i64 to_cap) {
    const i64 per = rows * cols, total = per * layers;
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (i64)gridDim.x * blockDim.x) {
        const i64 l = k / per, r = k - l * per;
        dst[l * to_cap * cols + r] = src[l * from_cap * cols + r];
    }
}
