// GPU tests of the decode kernels against the CPU reference.
