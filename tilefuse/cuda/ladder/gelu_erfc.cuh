// tilefuse: header portable=yes
//
// The exact (erf) GeLU of the Hopper rungs' epilogues (7-9), GeLU(x) = x * Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2
// and erfc(|u|) = exp(-u^2) * Q(t), t = 1 / (1 + 0.4 |u|): Q is the degree-8 polynomial of
// tilefuse/kernels/special.py (our own fit, tools/fit_erfc.py, relative error 1.2e-7 in exact arithmetic, ~1e-6
// with the approximate reciprocal and exp2), taken straight from x (0.4 / sqrt 2 = 0.2828..., u^2 = x^2 / 2), so the
// Triton GEMM's epilogue and these kernels compute the same function. One reciprocal, one exp2 and nine FMAs, no
// branch: libdevice's erff (two polynomials and selects, ~33 instructions) unrolled over the 128 accumulators of
// a consumer thread made rung 9's GeLU kernels spill 44 bytes once the epilogue became a template argument.
// GeLU(-inf) is NaN and GeLU(+inf) = +inf, as torch's; NaN stays NaN.
#pragma once

__device__ __forceinline__ float gelu_erfc(float x) {
    const float t = __fdividef(1.0f, fmaf(0.28284271247461906f, fabsf(x), 1.0f));
    float q = 0.0706699788570404f;
    q = fmaf(q, t, -0.38097816705703735f);
    q = fmaf(q, t, 0.6661408543586731f);
    q = fmaf(q, t, -0.3663370907306671f);
    q = fmaf(q, t, 0.4144163131713867f);
    q = fmaf(q, t, 0.13168321549892426f);
    q = fmaf(q, t, 0.2402118444442749f);
    q = fmaf(q, t, 0.2241220921278f);
    q = fmaf(q, t, 7.086526602506638e-05f);
    const float h = 0.5f * q * exp2f(x * x * -0.7213475204444817f);  // erfc(|x| / sqrt 2) / 2; -log2(e) / 2
    return x * (x > 0.0f ? 1.0f - h : h);
}
