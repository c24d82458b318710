// GPU tests of the prefill kernels against the CPU reference.
