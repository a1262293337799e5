"""Hand-written C++ kernels for the host CPU (one source on `at::vec::Vectorized`, built per vector ISA on
first use), serving the emulated device where Inductor's generated code falls short."""
