// GPU tests of the norms kernels against the CPU reference.
