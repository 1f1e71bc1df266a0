// Device math by overload: the float functions for float, the double ones for double, so
// that kernels templated on their compute type call one name.
#pragma once

namespace dtr::cuda::internal {

__device__ inline float exp_of(float x) { return expf(x); }
__device__ inline double exp_of(double x) { return exp(x); }
__device__ inline float log_of(float x) { return logf(x); }
__device__ inline double log_of(double x) { return log(x); }
__device__ inline float sqrt_of(float x) { return sqrtf(x); }
__device__ inline double sqrt_of(double x) { return sqrt(x); }
__device__ inline float rsqrt_of(float x) { return rsqrtf(x); }
__device__ inline double rsqrt_of(double x) { return rsqrt(x); }
__device__ inline float tanh_of(float x) { return tanhf(x); }
__device__ inline double tanh_of(double x) { return tanh(x); }
__device__ inline float erf_of(float x) { return erff(x); }
__device__ inline double erf_of(double x) { return erf(x); }
__device__ inline float pow_of(float x, float e) { return powf(x, e); }
__device__ inline double pow_of(double x, double e) { return pow(x, e); }
__device__ inline float abs_of(float x) { return fabsf(x); }
__device__ inline double abs_of(double x) { return fabs(x); }

}  // namespace dtr::cuda::internal
