// An empty library whose soname is libcuda.so.1, the CUDA driver's: loaded into a harness parent
// with LD_PRELOAD it looks, to the harness, as if CUDA had been initialised there
// (HarnessMustFail.ForkAfterCudaLoadedUsesSpawn). It defines nothing CUDA has.
extern "C" int tdc_fake_libcuda_marker() { return 1; }
